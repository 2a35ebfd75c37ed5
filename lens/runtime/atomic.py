"""Files and folders replaced whole: a reader (another process, the next run) finds the old one or the new one,
never a half-written one, and a failed write (a full disk, a read-only folder, Ctrl-C) leaves nothing behind.

Every derived file the workbench writes goes through here: results, reports, the main job's record, the caches
of corpora, WordNet and dequantised models, per-layer statistics. The store's manifest has a protocol of its own
(links refused, fault points, the folder synced: :func:`lens.store.format.write_json_atomic`)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path, suffix: str = ""):
    """A temporary name beside ``path`` to write to; moved onto ``path`` when the block ends and removed
    when it fails (a full disk, a read-only folder, Ctrl-C), so a reader finds the old file or the new
    one and never a half-written one, and no ``.tmp`` is left behind. ``suffix`` ends the temporary
    name for writers that append their own (``np.savez`` adds ``.npz``)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{suffix}")
    try:
        tmp.unlink(missing_ok=True)  # a leftover of a killed run (or a link planted there): never written through
        yield tmp
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.errno is not None and (exc.filename is None or Path(exc.filename) == tmp):
            raise OSError(exc.errno, exc.strerror, str(path)) from exc  # name the file meant, not its .tmp
        raise


def write_text_atomic(path, text: str, sync: bool = True) -> None:
    """``text`` into ``path`` through :func:`atomic_path` (``sync``: on disk before it replaces the old
    file, so a power cut too leaves one or the other)."""
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())


def write_json_file(path, data, indent: int | None = 1, sync: bool = True) -> None:
    """``data`` as JSON in ``path``, written atomically (:func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(data, indent=indent), sync=sync)


@contextmanager
def atomic_dir(target):
    """A fresh temporary folder beside ``target`` to fill; renamed onto ``target`` when the block ends. When
    ``target`` appeared meanwhile (another process filled it first) that one is kept and the temporary folder
    removed; it is removed too when the block fails."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield tmp
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race; use its copy
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
