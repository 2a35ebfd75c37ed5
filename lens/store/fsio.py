"""The store writer's file operations, in one place: none of them follows a link, and each can be observed.

Links: everything the store opens for writing is opened with ``O_NOFOLLOW`` (a new file also with
``O_EXCL``, so not even a dangling link is written through), and the folders it writes into are
checked with ``lstat`` to be real folders. A ``writer.lock``, ``manifest.json.tmp``, shard folder or
``shards/`` planted as a link by someone else is refused (:class:`lens.errors.StoreWriteError`,
exit 2, naming the path) and left as it is — its target untouched. The lock file must also be a
regular file with a single name (a hard link to another file would otherwise be truncated).

Observation: :func:`set_observer` installs a callable that is told of every operation after it
happened (``op`` and the path or file descriptor): ``create``, ``write``, ``fsync``, ``fsync_dir``,
``mkdir``, ``rename``, ``unlink``, ``rmtree``. The power-cut test records with it which writes were
not yet synced at each step of the commit protocol (tests/lens/store/test_store_power_cut.py); normally it
is ``None`` and costs one comparison.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from lens.errors import LensInputError, StoreWriteError

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIRECTORY = getattr(os, "O_DIRECTORY", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)

_observer = None


def set_observer(fn):
    """Install ``fn(op, path=None, fd=None, dst=None)`` (or ``None``); returns the previous observer."""
    global _observer
    previous, _observer = _observer, fn
    return previous


def _notify(op: str, **kw) -> None:
    if _observer is not None:
        _observer(op, **kw)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def refused(path, found: str, what: str = "file") -> StoreWriteError:
    return StoreWriteError(f"{path} is {found}, expected a regular {what} of the store: a store is never written "
                           f"through links or into other kinds of file; remove {path} (its target is untouched), "
                           "then rerun")


def _link_error(exc: OSError, path) -> StoreWriteError | None:
    """ELOOP from ``O_NOFOLLOW``: the last component is a link."""
    if exc.errno == errno.ELOOP:
        return refused(path, "a symbolic link")
    return None


def real_dir(path) -> Path:
    """``path`` must be a real folder (not a link to one): the store writes inside it."""
    path = Path(path)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise refused(path, _kind(st.st_mode), "folder")
    return path


def mkdir(path) -> None:
    os.mkdir(path, 0o755)
    _notify("mkdir", path=Path(path))


def make_dirs(path) -> list[Path]:
    """Create the folder ``path`` and any missing parents (an existing one is let be) and make each new name
    durable: the parent of every folder created is fsynced, top down, as SQLite syncs its journal's
    directory — without it a power cut after a finished capture can lose the store's folder, and with it the
    whole store. Returns the folders created."""
    path = Path(path)
    missing = []
    p = path
    while not os.path.lexists(p) and p.parent != p:
        missing.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    for d in reversed(missing):
        _notify("mkdir", path=d)
        fsync_dir(d.parent)
    return list(reversed(missing))


def ensure_dir(path) -> Path:
    """``path`` as a real folder, created if missing (its parent must exist)."""
    path = Path(path)
    try:
        mkdir(path)
    except FileExistsError:
        pass
    return real_dir(path)


def open_new(path) -> int:
    """A new file for writing: refused if anything (a file, a link, even a dangling one) has the name."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC, 0o644)
    except OSError as exc:
        err = _link_error(exc, path)
        if err is not None:
            raise err from None
        if exc.errno == errno.EEXIST and os.path.islink(path):
            raise refused(path, "a symbolic link") from None
        raise
    _notify("create", path=Path(path), fd=fd)
    return fd


def open_new_file(path, text: bool = False):
    """:func:`open_new` as a Python file object (binary, or UTF-8 text)."""
    fd = open_new(path)
    return os.fdopen(fd, "w", encoding="utf-8") if text else os.fdopen(fd, "wb")


def open_lock(path) -> int:
    """The lock file, created if missing, opened read-write without following a link: it must be a
    regular file with one name (not a link, hard link, FIFO or device someone planted there)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_nlink != 1):
        raise refused(path, _kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else
                      f"a file with {st.st_nlink} names (a hard link)")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW | CLOEXEC | NONBLOCK, 0o644)
    except OSError as exc:
        err = _link_error(exc, path)
        if err is not None:
            raise err from None
        raise
    st = os.fstat(fd)  # what was opened, in case the name changed since the lstat
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise refused(path, _kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else
                      f"a file with {st.st_nlink} names (a hard link)")
    _notify("create", path=Path(path), fd=fd)
    return fd


def read_small(path, limit: int = 1 << 16) -> bytes:
    """At most ``limit`` bytes of a regular file, not following a link (b"" for anything else)."""
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | CLOEXEC | NONBLOCK)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.read(fd, limit)
    except OSError:
        return b""
    finally:
        os.close(fd)


def pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        n = os.pwrite(fd, view, offset)
        if n == 0:  # a zero-byte write never makes progress: treat it as a full disk
            raise OSError(errno.ENOSPC, "No space left on device (zero-byte write)")
        view, offset = view[n:], offset + n
    _notify("write", fd=fd)


def truncate(fd: int, size: int) -> None:
    os.ftruncate(fd, size)
    _notify("write", fd=fd)


def allocate(fd: int, size: int) -> None:
    """Preallocate ``size`` bytes (or set the size where the filesystem cannot preallocate)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)  # no preallocation here: pwrite will report ENOSPC
    _notify("write", fd=fd)


def fsync(fd: int) -> None:
    os.fsync(fd)
    _notify("fsync", fd=fd)


def fsync_file(fh) -> None:
    fh.flush()
    fsync(fh.fileno())


def fsync_dir(path) -> None:
    """Make the folder's entries (created, renamed, removed names) durable. Filesystems that cannot sync
    a folder (EINVAL) are let be; a failing disk (EIO) is not."""
    try:
        fd = os.open(path, os.O_RDONLY | DIRECTORY | CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)
    _notify("fsync_dir", path=Path(path))


def rename(src, dst) -> None:
    """``os.replace`` (a link at ``dst`` is replaced, never written through)."""
    os.replace(src, dst)
    _notify("rename", path=Path(src), dst=Path(dst))


def unlink(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    _notify("unlink", path=Path(path))


def remove_tree(path) -> None:
    """Delete a folder the store made (a link in its place is removed, never followed)."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        unlink(path)
        return
    shutil.rmtree(path)
    _notify("rmtree", path=path)


# test hook: replaces the free space every size check sees (a capture's, an export's, an import's)
FREE_SPACE_ENV = "LENS_FREE_SPACE_BYTES"


def free_bytes(path) -> int:
    """Free bytes (for an unprivileged writer) of the filesystem that holds ``path``, or would hold it:
    the nearest existing folder above it is asked. ``LENS_FREE_SPACE_BYTES`` overrides (a test hook)."""
    fake = os.environ.get(FREE_SPACE_ENV)
    if fake:
        try:
            return int(fake)
        except ValueError:
            raise LensInputError(f"{FREE_SPACE_ENV} must be a number of bytes, got {fake!r}") from None
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def human_bytes(n: float) -> str:
    """``n`` bytes as text, decimal units (``4.2 GB``)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
