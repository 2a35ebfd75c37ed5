"""Which site-layer blocks of a store an export or a lazy view takes (``--sites``, ``--layers``), and the store's
blocks read shard by shard with their checksums checked."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch

from lens.errors import LensInputError, StoreCorruptError
from lens.sites import HookSite, Site, parse_layers
from lens.store.checksum import crc32
from lens.store.format import site_width, storage_np_dtype
from lens.store.shardfiles import read_block_into


@dataclass(frozen=True)
class Block:
    """One site-layer of a store: ``idx`` is the layer's index in the site's layer block list."""

    site: str
    layer: int | None
    idx: int

    @property
    def key(self) -> str:
        """``resid_post.3`` / ``embed`` (:attr:`lens.sites.HookSite.key`)."""
        return HookSite(Site(self.site), self.layer).key


def require_on_disk(store) -> None:
    """Refuse a store held in memory or on a device: the exports stream a store's checked files."""
    if store.root is None:
        raise LensInputError("only a store on disk can be exported: this one is held in memory (capture it with "
                             "out=DIR, or `lens capture ... --out DIR`, and export DIR); store.to_xarray() and "
                             "store.to_dask() read it as it is")


def select(manifest: dict, sites=None, layers=None) -> list[Block]:
    """The blocks of ``sites`` (default: every site of the store) at ``layers`` (default: every stored
    layer; ``"0,3,-1"``, ``"all"`` or a list), in the manifest's order; refused when nothing or an absent
    site or layer is asked for."""
    stored = manifest["sites"]
    if isinstance(sites, str):
        sites = [s for s in sites.split(",") if s.strip()]
    names = [Site.parse(s).value for s in sites] if sites else list(stored)
    for name in names:
        if name not in stored:
            raise LensInputError(f"site {name!r} is not in this store (it has {', '.join(stored)})")
    want = None
    if layers is not None and layers != "all":
        want = parse_layers(layers, int(manifest["model"]["n_layers"]))
    out = []
    for name in names:
        site_layers = stored[name]
        if not Site(name).per_layer or want is None:
            out += [Block(name, l, i) for i, l in enumerate(site_layers)]
            continue
        missing = [l for l in want if l not in site_layers]
        if missing:
            raise LensInputError(f"layer {missing[0]} of {name} is not in this store: stored layers are {site_layers}")
        out += [Block(name, l, site_layers.index(l)) for l in want]
    if not out:
        raise LensInputError("nothing to export: no site and layer selected")
    return out


def row_bytes(manifest: dict, blocks: list[Block]) -> int:
    """Bytes of one token over ``blocks`` in the stored dtype."""
    itemsize = storage_np_dtype(manifest["dtype"]).itemsize
    return sum(site_width(manifest, b.site) for b in blocks) * itemsize


def row_chunks(n: int, per: int):
    """``[lo, hi)`` ranges of at most ``per`` rows covering ``0..n``."""
    per = max(1, int(per))
    return [(lo, min(lo + per, n)) for lo in range(0, n, per)] or [(0, 0)]


def widen(block: np.ndarray, dtype: str) -> np.ndarray:
    """Stored values as a numpy float array: bfloat16 bit patterns widened exactly to float32 (by torch's cast,
    the same bits as ``(a.astype(np.uint32) << 16).view(np.float32)`` at a fraction of the time)."""
    if dtype == "bfloat16":
        a = np.ascontiguousarray(block).view(np.int16)
        return torch.from_numpy(a).view(torch.bfloat16).float().numpy()
    return np.asarray(block)


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays hold the same bytes (compared 8 at a time where they allow it)."""
    a, b = np.ascontiguousarray(a).reshape(-1).view(np.uint8), np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    if a.size != b.size:
        return False
    if a.size % 8 == 0:
        a, b = a.view(np.uint64), b.view(np.uint64)
    return bool(np.array_equal(a, b))




def prefetched(items: Iterable, depth: int = 1):
    """Yield what the iterator ``items`` yields, each computed ``depth`` ahead in a background thread: the next
    block's read, CRC and widening (``preadv``, the CRC-32 and torch's cast all release the GIL) overlap the
    writing of this one. At most ``depth + 1`` items are held; an exception in the thread is raised here, in
    order; a consumer that stops early stops the thread."""
    done, box = object(), queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(x) -> bool:
        while not stop.is_set():
            try:
                box.put(x, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run():
        try:
            for x in items:
                if not put((x, None)):
                    return
            put((done, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            put((done, exc))

    worker = threading.Thread(target=run, name="lens-export-read", daemon=True)
    worker.start()
    try:
        while True:
            x, exc = box.get()
            if x is done:
                if exc is not None:
                    raise exc
                return
            yield x
    finally:
        stop.set()
        worker.join()


def shard_offsets(manifest: dict) -> np.ndarray:
    """The first token of each shard, and the total at the end."""
    return np.concatenate([[0], np.cumsum([int(s["n_tokens"]) for s in manifest["shards"]])]).astype(np.int64)


class BufferPool:
    """Arrays taken and given back, to be handed out again: a fresh large array costs a page fault and the
    zeroing of each of its pages when first written (in the kernel, a third of a safetensors export's CPU
    seconds on 64 MB blocks), a reused one nothing. Thread-safe; it holds what was given back (bounded by
    what its users have in flight at once)."""

    def __init__(self):
        self._free: dict = {}
        self._lock = threading.Lock()

    def take(self, shape, dtype) -> np.ndarray:
        key = (tuple(int(s) for s in shape), np.dtype(dtype).str)
        with self._lock:
            free = self._free.get(key)
            if free:
                return free.pop()
        return np.empty(key[0], dtype=dtype)

    def give(self, arrays: Iterable[np.ndarray]) -> None:
        """Hand back arrays from :meth:`take` that no one reads or writes any more."""
        with self._lock:
            for a in arrays:
                self._free.setdefault((a.shape, a.dtype.str), []).append(a)


def read_block(files, manifest: dict, shard: dict, block: Block, pool: BufferPool | None = None) -> np.ndarray:
    """One shard's layer block of a site, (tokens, width) in the storage dtype, read with one positioned read
    (not through a memory map: page faults make that several times slower on large blocks) and checked against
    the CRC the manifest records. ``files``: a :class:`lens.store.shardfiles.ShardFiles` (the file's size and
    header are checked there); ``pool``: where the array comes from (given back there by the caller)."""
    path, header = files.site_file(shard, block.site)
    n, width = int(shard["n_tokens"]), site_width(manifest, block.site)
    data = np.empty((n, width), dtype=header.dtype) if pool is None else pool.take((n, width), header.dtype)
    raw = read_block_into(path, data, header, block.idx).reshape(-1).view(np.uint8)
    want = shard["files"][f"{block.site}.npy"]["layer_crc32"][block.idx]
    crc = f"{crc32(raw):08x}"
    if crc != want:
        raise StoreCorruptError(f"{path}: layer block {block.idx} fails its checksum (crc32 {crc}, manifest {want}): "
                                "the file is damaged")
    return data


class BlockReader:
    """Rows of a site-layer across shards, each shard's block read once (:func:`read_block`) and the last two kept."""

    def __init__(self, files, manifest: dict):
        self.files, self.manifest = files, manifest
        self.offsets = shard_offsets(manifest)
        self._cache: dict = {}

    def block(self, i: int, block: Block) -> np.ndarray:
        key = (i, block.site, block.idx)
        if key not in self._cache:
            if len(self._cache) >= 2:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = read_block(self.files, self.manifest, self.manifest["shards"][i], block)
        return self._cache[key]

    def rows(self, block: Block, lo: int, hi: int) -> np.ndarray:
        """Rows ``[lo, hi)`` in the storage dtype."""
        parts = []
        first = int(np.searchsorted(self.offsets, lo, side="right")) - 1
        for i in range(max(first, 0), len(self.manifest["shards"])):
            s0, s1 = int(self.offsets[i]), int(self.offsets[i + 1])
            if s0 >= hi:
                break
            a, b = max(lo, s0), min(hi, s1)
            if b > a:
                parts.append(self.block(i, block)[a - s0:b - s0])
        width = site_width(self.manifest, block.site)
        return np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else \
            np.zeros((0, width), dtype=storage_np_dtype(self.manifest["dtype"]))


__all__ = ["Block", "BufferPool", "require_on_disk", "select", "row_bytes", "row_chunks", "widen", "same_bytes", "read_block", "BlockReader",
           "shard_offsets", "prefetched"]
