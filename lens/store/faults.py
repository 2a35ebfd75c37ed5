"""Named fault points in the store's commit protocol: the test hook behind the crash and full-disk tests.

The writer calls :func:`fault_point` at every step of its protocol (see ``docs/store.md``). Normally
that is one dictionary lookup. With ``LENS_STORE_FAULT=POINT[@N][=ACTION]`` in the environment, the
N-th time (default 1st) the process reaches ``POINT`` it performs ``ACTION``:

* ``kill`` (default): ``SIGKILL`` itself — the same as a ``kill -9`` landing exactly there;
* ``enospc``: raise ``OSError(ENOSPC)`` — the disk filled up at that step;
* ``eio``: raise ``OSError(EIO)``.

The variable is read at each call (not at import) so a test can set it in a forked child.
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "LENS_STORE_FAULT"

# Every point the writer reaches, in protocol order. The tests iterate over this list, so a new step
# in the protocol gets a crash test by being named here.
POINTS = (
    "lock.acquired",          # writer.lock is held, nothing else written yet
    "manifest.tmp-written",   # manifest.json.tmp is complete and fsynced, not yet renamed
    "manifest.replaced",      # manifest.json replaced, folder not yet fsynced
    "shard.begin",            # NNNNN.partial/ created with its preallocated .npy files
    "write",                  # one pwrite of activations (hit many times per shard)
    "shard.data-synced",      # activation files fsynced and closed
    "shard.tokens-written",   # token columns written and fsynced
    "shard.before-rename",    # the partial folder is complete, not yet renamed
    "shard.renamed",          # NNNNN/ is in place but the manifest does not list it yet
)

_hits: dict[str, int] = {}


def _parse(spec: str) -> tuple[str, int, str]:
    point, _, action = spec.partition("=")
    point, _, nth = point.partition("@")
    return point.strip(), int(nth) if nth else 1, (action.strip() or "kill")


def fault_point(name: str) -> None:
    """Reach the protocol step ``name``; performs the fault configured for it, if any."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, nth, action = _parse(spec)
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] != nth:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "enospc":
        raise OSError(errno.ENOSPC, f"No space left on device (injected at {name}@{nth})")
    if action == "eio":
        raise OSError(errno.EIO, f"Input/output error (injected at {name}@{nth})")
    raise ValueError(f"{ENV}: unknown action {action!r} (expected kill, enospc or eio)")


def reset() -> None:
    """Forget the hit counts (a forked test child starts counting from zero)."""
    _hits.clear()
