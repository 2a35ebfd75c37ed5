"""Streaming writer: the store's commit protocol.

One shard at a time (each step is a named fault point, :mod:`lens.store.faults`):

1. ``shard.begin`` — check free space and inodes for the whole shard, create ``NNNNN.partial/`` and
   its activation files, preallocated (:class:`lens.store.npyfile.BlockFile`);
2. ``write`` — positioned writes of each batch's states; CRC-32 per layer block accumulates;
3. ``shard.data-synced`` — activation files fsynced; ``shard.tokens-written`` — token columns
   written and fsynced; ``shard.before-rename`` — the partial folder fsynced;
4. ``shard.renamed`` — ``NNNNN.partial/`` renamed to ``NNNNN/`` (the shard is complete on disk);
5. ``manifest.tmp-written`` / ``manifest.replaced`` — the manifest, now listing the shard and
   sealed with its checksum, replaces the old one atomically. This is the commit.

A crash before 5 leaves the last committed manifest, which does not list the shard: a reader never
sees it, and :meth:`ShardWriter.recover` (run before writing resumes) deletes ``*.partial`` folders
and discards a renamed-but-unlisted shard (a crash between 4 and 5), which is then rewritten
identically — windows and batches are cut deterministically. Memory stays flat however many tokens
are captured: states go to the page cache, one batch at a time.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lens.errors import StoreCorruptError, StoreWriteError
from lens.store import fsio
from lens.store.faults import fault_point
from lens.store.format import (MANIFEST, PARTIAL, SHARDS, TOKEN_COLUMNS, crc32_file, fsync_dir, storage_np_dtype,
                               to_storage_counted, write_manifest)
from lens.store.manifest import Manifest, ShardEntry
from lens.store.npyfile import BlockFile, save_column
from lens.store.stats import shard_sums, stats_file, token_groups
from lens.store.lock import LOCK, WriterLock

log = logging.getLogger(__name__)

SHARD_NAME = re.compile(r"[0-9]{5,}")
TOKEN_BYTES = 7 * 8 + 1 + 4 * 48  # int64 columns, the bool column, generous room for the token text
SPACE_MARGIN = 64 << 10  # manifest rewrites and the estimate of the token text are covered separately

# Writing errors that the user can act on (free space, fix permissions); the store stays resumable.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO,
                errno.EMLINK}


def _columns(token_rows: dict) -> dict:
    """The token columns in the dtypes the reader expects (int64 / bool / unicode)."""
    out = {}
    for col in TOKEN_COLUMNS:
        a = np.asarray(token_rows[col])
        if col == "special":
            a = a.astype(np.bool_)
        elif col == "token":
            a = a.astype(str)
        else:
            a = a.astype("<i8")
        out[col] = a
    return out


@dataclass
class _OpenShard:
    """The shard being written: its partial folder, activation files (site -> BlockFile), rows written so far,
    and non-finite counts (site -> one per layer)."""

    name: str
    path: Path
    n_tokens: int
    window_start: int
    window_end: int
    nonfinite: dict
    files: dict = field(default_factory=dict)
    fill: int = 0


class ShardWriter:
    """Writes the shards of one store. ``manifest``: the store's manifest value (a new store's first one,
    :meth:`Manifest.first`, or a resumed store's); :attr:`manifest` is always the last one committed (or, before
    the first commit, the one given), each shard's derived from it (:meth:`Manifest.with_shard`)."""

    def __init__(self, root: Path, manifest: Manifest):
        self.root = Path(root)
        if manifest.nonfinite is None:
            manifest = manifest.with_(nonfinite={s: [0] * len(l) for s, l in manifest.sites.items()})
        self.manifest = manifest
        self._open: _OpenShard | None = None

    # ------------------------------------------------------------------ recovery
    def recover(self) -> list[str]:
        """Make the folder match its manifest before writing resumes; returns what was cleaned up.

        Deletes ``*.partial`` shards and shards that were renamed into place but never listed (the
        capture stopped between the rename and the manifest commit), and checks that every listed
        shard's files are present with their recorded sizes."""
        shards = fsio.ensure_dir(self.root / SHARDS)  # refused if a link: the store writes only inside itself
        listed = {s.name for s in self.manifest.shards}
        cleaned = []
        for entry in sorted(shards.iterdir()):
            if entry.name.endswith(PARTIAL):
                cleaned.append(f"partial shard {entry.name} (interrupted while being written)")
            elif SHARD_NAME.fullmatch(entry.name) and entry.name not in listed:
                cleaned.append(f"shard {entry.name} (renamed into place, but the capture stopped before the "
                               "manifest listed it)")
            else:
                continue
            fsio.remove_tree(entry)  # a link is removed, never followed
        fsio.unlink(self.root / (MANIFEST + ".tmp"))
        for shard in self.manifest.shards:
            for fname, meta in {**shard.files, **(shard.stats or {})}.items():
                path = shards / shard.name / fname
                try:
                    st = os.lstat(path)
                    size = st.st_size if stat.S_ISREG(st.st_mode) else None
                except OSError:
                    size = None
                if size != meta["bytes"]:
                    found = "missing" if size is None else f"{size} bytes, the manifest says {meta['bytes']}"
                    raise StoreCorruptError(
                        f"{path}: {found} — a committed shard is damaged; run `lens store verify {self.root}`, "
                        "then capture into a new folder")
        for line in cleaned:
            log.info("%s: discarded %s", self.root, line)
        if cleaned:
            fsync_dir(shards)
        return cleaned

    def commit_manifest(self, manifest: Manifest | None = None) -> None:
        """Commit ``manifest`` (default: the current one) and keep it, sealed, as :attr:`manifest`; a failed
        commit leaves :attr:`manifest` as it was (the last one committed)."""
        # the manifest fsynced, renamed into place, the folder fsynced
        sealed = write_manifest(self.root, self.manifest if manifest is None else manifest)
        self.manifest = sealed
        if sealed.complete:  # the final commit: the store's own name durable in its parent as well
            fsync_dir(self.root.absolute().parent)

    def complete(self) -> None:
        """Mark the store complete and commit it (after its last shard)."""
        self.commit_manifest(self.manifest.with_(complete=True))

    # ------------------------------------------------------------------ one shard
    def _check_space(self, n_tokens: int) -> None:
        """Refuse a shard that cannot fit, before computing it (the kernel would say so at the first
        write anyway; this says it with numbers, and leaves no half-written shard to clean up)."""
        if os.environ.get("LENS_STORE_SPACE_CHECK", "1") == "0":  # test aid: reach the kernel's ENOSPC
            return
        m = self.manifest
        itemsize = storage_np_dtype(m.dtype).itemsize
        need = sum(len(l) * n_tokens * m.width(s) * itemsize + 256 for s, l in m.sites.items())
        need += n_tokens * TOKEN_BYTES + 4 * len(str(m.to_dict())) + SPACE_MARGIN
        need += sum(4 * len(l) * (3 + 3 * m.width(s)) * 8 + 128 for s, l in m.sites.items())  # lens.store.stats
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize
        if free < need:
            raise OSError(errno.ENOSPC, f"No space left on device: the next shard needs about {need / 1e6:.1f} MB, "
                          f"{free / 1e6:.1f} MB are free")
        n_files = 2 * len(m.sites) + len(TOKEN_COLUMNS) + 4
        if st.f_files and st.f_favail < n_files:
            raise OSError(errno.ENOSPC, f"No inodes left on device: the next shard needs {n_files} files, "
                          f"{st.f_favail} are free")

    def begin(self, window_start: int, window_end: int, n_tokens: int) -> None:
        self._check_space(n_tokens)
        m = self.manifest
        name = f"{len(m.shards):05d}"
        path = self.root / SHARDS / (name + PARTIAL)
        cur = self._open = _OpenShard(name, path, n_tokens, window_start, window_end,
                                      nonfinite={s.value: [0] * len(l) for s, l in m.sites.items()})
        fsio.real_dir(path.parent)
        fsio.mkdir(path)
        dtype = storage_np_dtype(m.dtype)
        for site, layers in m.sites.items():
            cur.files[site.value] = BlockFile(path / f"{site.value}.npy", dtype, (len(layers), n_tokens, m.width(site)))
        fault_point("shard.begin")

    def _current(self, what: str) -> "_OpenShard":
        """The shard being written (a caller's order error, not bad input: ``begin`` comes first)."""
        if self._open is None:
            raise RuntimeError(f"ShardWriter.{what} called before begin(): no shard is open")
        return self._open

    def add_batch(self, states: dict, layer_index: dict, n: int) -> None:
        """``states``: hook key -> tensor (n, d_model) of real (unpadded) tokens, in order."""
        self.add_stored({key: to_storage_counted(value, self.manifest.dtype) for key, value in states.items()},
                        layer_index, n)

    def add_stored(self, stored: dict, layer_index: dict, n: int) -> None:
        """One batch already cast: hook key -> (array (n, width) in the storage dtype, non-finite count)."""
        cur = self._current("add_stored")
        for key, (data, bad) in stored.items():
            site, idx = layer_index[key]
            self.add_rows(site, idx, cur.fill, data, bad)
        cur.fill += n

    def add_rows(self, site: str, idx: int, row: int, data: np.ndarray, nonfinite: int = 0) -> None:
        """Rows ``row..`` of layer block ``idx`` of ``site``, already in the storage dtype (rows of a
        block come in order); ``nonfinite``: how many of its values are NaN/inf."""
        cur = self._current("add_rows")
        cur.files[site].write(idx, row, data)
        cur.nonfinite[site][idx] += nonfinite

    def finish(self, token_rows: dict) -> None:
        cur = self._current("finish")
        if not all(f.complete() for f in cur.files.values()):  # every row of every layer block written
            raise RuntimeError(f"shard {cur.name} is missing rows: planned {cur.n_tokens} tokens")
        files = {}
        for site, bf in cur.files.items():
            bf.close(sync=True)
            files[f"{site}.npy"] = bf.meta()
        fault_point("shard.data-synced")
        for col, array in _columns(token_rows).items():
            path = cur.path / f"tokens.{col}.npy"
            save_column(path, array)
            files[path.name] = {"bytes": path.stat().st_size, "crc32": crc32_file(path)}
        fault_point("shard.tokens-written")
        stats = self._write_stats(cur, token_rows)
        fsync_dir(cur.path)
        fault_point("shard.before-rename")
        final = self.root / SHARDS / cur.name
        fsio.rename(cur.path, final)
        fault_point("shard.renamed")
        fsync_dir(final.parent)
        self._open = None
        entry = ShardEntry.build(cur.name, cur.n_tokens, cur.window_start, cur.window_end,
                                 files=dict(sorted(files.items())), stats=stats, nonfinite=cur.nonfinite)
        # a failed commit keeps the last committed manifest: the renamed shard is discarded on resume
        self.commit_manifest(self.manifest.with_shard(entry))

    def _write_stats(self, cur: _OpenShard, token_rows: dict) -> dict:
        """Each site's statistics of the shard (:mod:`lens.store.stats`), reduced from the bytes just
        written (read back from the page cache) and saved beside them; returns their manifest entries."""
        groups = token_groups(token_rows["special"], token_rows["pos"])
        out = {}
        for site, bf in cur.files.items():
            data = np.memmap(bf.path, dtype=bf.dtype, mode="r", offset=len(bf.header), shape=bf.shape)
            try:
                sums = shard_sums((data[i] for i in range(bf.shape[0])), self.manifest.dtype, groups)
            finally:
                del data
            path = cur.path / stats_file(site)
            save_column(path, sums)
            out[path.name] = {"bytes": path.stat().st_size, "crc32": crc32_file(path)}
        return out

    def abort(self) -> None:
        """After a failed write: close and delete the shard being written (frees its space at once)."""
        cur, self._open = self._open, None
        if cur is None:
            return
        for bf in cur.files.values():
            try:
                bf.close(sync=False)
            except OSError:
                pass
        try:
            fsio.remove_tree(cur.path)
        except OSError:
            pass


def describe_write_error(exc: OSError, root: Path, manifest: Manifest) -> str:
    """One line: what failed, what is safe on disk (``manifest``: the last one committed), what to do."""
    done = manifest.shards
    safe = (f"{len(done)} shards ({manifest.n_tokens} tokens) are committed and intact" if done
            else "no shard was committed yet")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            st = os.statvfs(root)
            free, inodes = st.f_bavail * st.f_frsize, (st.f_favail if st.f_files else None)
        except OSError:
            free, inodes = None, None
        if inodes is not None and inodes < len(manifest.sites) + len(TOKEN_COLUMNS) + 4:
            why = f"the filesystem has no inodes left ({inodes} free): {exc.strerror or exc}"
        else:
            why = f"the disk is full{'' if free is None else f' ({free / 1e6:.1f} MB free)'}: {exc.strerror or exc}"
        todo = "free some space, then rerun the same command with --resume"
    else:
        why = f"{exc.strerror or exc}{': ' + str(exc.filename) if exc.filename else ''}"
        todo = "fix that, then rerun the same command with --resume"
    return f"cannot write the store {root}: {why}; {safe}; {todo}"


def is_write_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS


def discard_unfinished(writer: "ShardWriter", out: Path, exc: BaseException, rerun: str) -> None:
    """After a merge or an import that held ``out``'s writer lock failed with ``exc``: abort the writer, remove
    everything in ``out`` but the lock (a link is removed, never followed), so nothing of a half-made store is kept,
    and turn a write error (a full disk, a read-only folder) into :class:`StoreWriteError` whose message ends with
    ``rerun`` (what to do next). Any other ``exc`` is left for the caller to re-raise."""
    writer.abort()
    for p in (out.iterdir() if out.is_dir() else ()):
        if p.name != LOCK:
            try:
                fsio.remove_tree(p)
            except OSError:
                pass
    if isinstance(exc, OSError) and is_write_error(exc):
        raise StoreWriteError(f"cannot write the store {out}: {exc.strerror or exc}; nothing was kept{rerun}") from None


__all__ = ["ShardWriter", "describe_write_error", "discard_unfinished", "is_write_error"]


def take_writer_lock(root: Path, advice: str = "", work: str = "capture"):
    """The writer lock of store folder ``root`` (created if missing): ``(lock, created)``. A lock that
    cannot be written (full disk, no permission) leaves no folder behind and raises StoreWriteError;
    another writer's lock raises StoreLockedError (``work``: what holds such a folder, for its message)."""
    root = Path(root)
    created = not root.exists()
    lock = WriterLock(root, work=work)
    try:
        lock.acquire()
    except OSError as exc:
        lock.release()
        if created:
            shutil.rmtree(root, ignore_errors=True)
        if not is_write_error(exc):
            raise
        noun = "the store" if work == "capture" else "the folder"
        raise StoreWriteError(f"cannot write {noun} {root}: {exc.strerror or exc}; nothing was written"
                              + (f"; {advice}" if advice else "")) from None
    return lock, created
