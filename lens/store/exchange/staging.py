"""Where an export is written: a hidden staging folder beside ``--out``, renamed onto it when complete.

``staged(out)`` refuses an ``--out`` that exists (nothing is overwritten) or lies inside a store, checks the
free space for the bytes the export will write first (``LENS_FREE_SPACE_BYTES`` overrides what the filesystem
reports, as for a capture), and yields the staging folder ``.OUT.partial-PID``. When the block ends the
folder's files are fsynced, the folder is renamed onto ``OUT`` and the parent folder fsynced; when it fails
(a full disk, a failed read-back, Ctrl-C) the staging folder is removed. A reader therefore finds a whole
export at ``OUT`` or nothing there; a staging folder left by a killed process never has the name asked for.
"""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from lens.errors import LensInputError, StoreWriteError
from lens.store.format import enclosing_store
from lens.store.fsio import free_bytes, human_bytes

MARGIN = 1 << 20


def check_target(out: Path, what: str) -> None:
    """Refuse an ``--out`` that exists or lies inside a store (before anything is read or written)."""
    if out.exists() or out.is_symlink():
        raise LensInputError(f"--out {out} already exists: {what} into a new folder (nothing is overwritten)")
    inside = enclosing_store(out.parent)
    if inside is not None:
        raise LensInputError(f"--out {out} lies inside the store {inside}: {what} into a folder outside any store")


def check_space(out: Path, need: int, what: str) -> int:
    free = free_bytes(out)
    if free < need + MARGIN:
        raise StoreWriteError(f"{what} into {out} would write {human_bytes(need)} but its filesystem has {human_bytes(free)} "
                              "free: free some space or choose another --out; nothing was written")
    return free


def _fsync_tree(root: Path) -> None:
    for folder, dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def staged(out, need: int, what: str = "export"):
    """A fresh staging folder for an export of about ``need`` bytes into ``out`` (see the module docstring)."""
    out = Path(out)
    check_target(out, what)
    check_space(out, need, what)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir()
        yield tmp
        _fsync_tree(tmp)
        if out.exists():
            raise LensInputError(f"--out {out} appeared while the {what} ran: nothing was overwritten")
        os.rename(tmp, out)
        fsync_dir(out.parent)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES,
                                                      errno.EPERM, errno.EIO, errno.EFBIG):
            raise StoreWriteError(f"cannot write the {what} {out}: {exc.strerror or exc}; nothing was kept (the "
                                  "source is untouched): fix that and run it again") from None
        raise


__all__ = ["staged", "check_target", "check_space", "free_bytes", "human_bytes", "fsync_dir"]
