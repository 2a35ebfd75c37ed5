"""One writer per store folder: an advisory lock file, ``STORE/writer.lock``.

The lock is an ``flock`` on that file, which the kernel drops when its holder dies — a capture killed
with ``kill -9`` leaves a lock file but not a lock, so a stale lock is detected by simply acquiring it
(the file's previous content, host and pid of the dead writer, is logged). The file holds the live
writer's host, pid, start time and command, which is what a refused second writer is told.

Where ``flock`` is not supported (some network filesystems answer ENOLCK), the file is created
exclusively instead and judged stale when it names this host and a pid that no longer runs; a lock
from another host is then refused with the advice to delete the file if that writer is gone.

The lock file is opened with ``O_NOFOLLOW`` and must be a regular file with one name
(:func:`lens.store.fsio.open_lock`): a ``writer.lock`` planted as a link to another file is refused,
and that file is never written. The lock file is unlinked on release. A process that opened the file just before it was unlinked
could otherwise lock an orphaned inode, so after locking, the path must still name the locked inode.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]

from lens.errors import StoreLockedError
from lens.store import fsio
from lens.store.faults import fault_point

log = logging.getLogger(__name__)

LOCK = "writer.lock"


def describe_holder(info: dict) -> str:
    if not info:
        return "another process"
    cmd = info.get("command", "")
    return (f"pid {info.get('pid', '?')} on host {info.get('host', '?')} (since {info.get('started', '?')}"
            f"{', ' + cmd if cmd else ''})")


def read_holder(path: Path) -> dict:
    """The holder recorded in a lock file; ``{}`` if it cannot be read (a link, a FIFO, garbage: never
    followed, never read past 64 KiB)."""
    try:
        data = json.loads(fsio.read_small(path).decode("utf-8") or "{}")
        return data if isinstance(data, dict) else {}
    except (ValueError, RecursionError):
        return {}


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


class WriterLock:
    """``with WriterLock(root):`` — hold the store folder ``root`` for writing (created if missing).
    ``work``: what holds such a folder, for the refusal (a capture; a main job for a results folder)."""

    def __init__(self, root, work: str = "capture"):
        self.root = Path(root)
        self.path = self.root / LOCK
        self.work = work
        self._fd = -1

    def __enter__(self) -> "WriterLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _info(self) -> bytes:
        info = {"host": socket.gethostname(), "pid": os.getpid(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:200]}
        return json.dumps(info).encode()

    def acquire(self) -> None:
        fsio.make_dirs(self.root)  # a folder it creates is made durable in its parent (fsync of the parent)
        while True:
            fd = fsio.open_lock(self.path)  # O_NOFOLLOW, a regular file with one name: else refused, untouched
            try:
                if fcntl is None:
                    raise OSError(errno.ENOLCK, "flock unavailable")
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise StoreLockedError(
                    f"{self.root} is being written by {describe_holder(read_holder(self.path))}: wait for that {self.work} "
                    "to finish (then --resume if it was interrupted), or choose another --out") from None
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                self._acquire_exclusive_file()
                return
            try:
                same = os.lstat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the previous holder released (and unlinked) it between our open and flock
        previous = read_holder(self.path)
        if previous:  # the kernel dropped its flock with it: nothing to warn about (a refusal after this is one line)
            log.info("%s: taking over a stale writer lock left by %s, which is no longer running",
                     self.root, describe_holder(previous))
        try:
            fsio.truncate(fd, 0)
            fsio.pwrite_all(fd, self._info(), 0)
            fsio.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        fault_point("lock.acquired")

    def _acquire_exclusive_file(self) -> None:
        host = socket.gethostname()
        for _ in range(2):
            try:
                fd = fsio.open_new(self.path)  # O_EXCL | O_NOFOLLOW
            except FileExistsError:
                info = read_holder(self.path)
                if info.get("host") == host and not _pid_alive(info.get("pid")):
                    log.info("%s: removing a stale writer lock left by %s", self.root, describe_holder(info))
                    fsio.unlink(self.path)
                    continue
                where = "" if info.get("host") == host else f" (if that writer is gone, delete {self.path})"
                raise StoreLockedError(f"{self.root} is being written by {describe_holder(info)}{where}: wait for it, "
                                       "or choose another --out") from None
            try:
                fsio.pwrite_all(fd, self._info(), 0)
                fsio.fsync(fd)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            fault_point("lock.acquired")
            return
        raise StoreLockedError(f"{self.root}: could not take the writer lock {self.path}")

    def release(self) -> None:
        if self._fd < 0:
            return
        try:
            try:
                ours = os.lstat(self.path).st_ino == os.fstat(self._fd).st_ino
            except OSError:
                ours = False
            if ours:  # while still holding it (see the module docstring); a name someone swapped in is theirs
                fsio.unlink(self.path)
        finally:
            os.close(self._fd)
            self._fd = -1
