"""Statistics written with the store: the sums of :class:`lens.store.layer_stats.LayerStats`, per shard.

When a shard is finished (:meth:`lens.store.writer.ShardWriter.finish`, for a capture and for a merge
alike) each site's layer blocks are read back once from the page cache and reduced, in float64, to the
sums the anisotropy and rogue-dimension measures need (count, Σx, Σ‖x‖², Σ x/‖x‖, Σ (x/‖x‖)², all-zero
rows; see :mod:`lens.store.layer_stats`), written as ``shards/NNNNN/stats.SITE.npy`` and listed in the shard's
manifest entry under ``stats`` with its size and CRC-32. The sums are kept apart for four groups of
tokens — special or not × first window position (``pos == 0``) or not — so that the populations of
``store.mask(drop_special, min_pos)`` for ``min_pos`` 0 or 1 are sums of groups.

Why per shard and from the stored bytes: a shard's statistics are a function of its bytes alone
(reduced over fixed blocks of :data:`CHUNK_ROWS` rows, whatever batches the rows came in), so a resumed
capture, each part of a split one and their merge write the same ``stats`` files as one uninterrupted
capture, byte for byte; the store's statistics add the shards' in shard order. The d × d Gram matrix is
not kept (d² × 8 bytes per layer per shard): no covariance or top-PC share from these statistics.

File layout: ``float64`` ``(group, layer, 3 + 3 d)``; per group and layer ``[n, n_zero, Σ‖x‖², Σx (d),
Σû (d), Σû² (d)]``, groups in the order of :data:`GROUPS`. Stores written before this have no ``stats``
entries: :func:`store_stats` then computes the same sums from the rows in one streaming pass.

Speed: the column sums (Σx, Σû, Σû²) are one compiled pass per block (numba), in the order of numpy's
``x.sum(axis=0)`` that wrote every store before it, and bfloat16 is widened in one compiled pass; the row
norms stay numpy's ``einsum`` (its SIMD order is the build's own). The bytes are those of the numpy code
(tests/lens/store/test_stats_kernel.py keeps it as the reference), NaN payloads aside: a column sum that
meets two different NaNs keeps the first, as numpy's SIMD loop does (its scalar tail keeps the second).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import njit

from lens.errors import StoreCorruptError
from lens.store.layer_stats import NO_LAYER, LayerStats
from lens.store.npyfile import parse_header
from lens.sites import Site
from lens.store.format import crc32_file, to_storage
from lens.store.manifest import Manifest, ShardEntry

GROUPS = ((False, False), (False, True), (True, False), (True, True))  # (special, at position 0)
CHUNK_ROWS = 1024  # rows reduced at a time (fixed, so the sums do not depend on how rows arrived)
HEAD = 3  # n, n_zero, Σ‖x‖²
_MIN_COMPILED_D = 2  # below: numpy's column sums (a one-column sum is pairwise, not row by row)


def stats_file(site: str) -> str:
    return f"stats.{site}.npy"


def widen(a: np.ndarray, dtype: str) -> np.ndarray:
    """Stored rows (storage dtype) as float64."""
    if dtype == "bfloat16":
        a = (np.asarray(a).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(a, dtype=np.float64)


def token_groups(special, pos) -> np.ndarray:
    """Each token's group index in :data:`GROUPS` (int8)."""
    return (np.asarray(special, dtype=bool).astype(np.int8) * 2 + (np.asarray(pos) == 0).astype(np.int8))


def _sums(x: np.ndarray, d: int) -> np.ndarray:
    """``[n, n_zero, Σ‖x‖², Σx, Σû, Σû²]`` of the float64 rows ``x`` (C-contiguous, not changed).

    The row norms come from numpy (``einsum``: its SIMD order is numpy's own, kept as is) and the
    column sums from :func:`_column_sums` in one compiled pass, in the order of numpy's ``x.sum(axis=0)``
    that wrote the stores before it (each column added row by row from 0.0), so the bytes are the same."""
    o = np.empty(HEAD + 3 * d)
    sq = np.einsum("ij,ij->i", x, x)
    norm = np.sqrt(sq)
    zero = norm == 0
    o[0], o[1], o[2] = x.shape[0], np.count_nonzero(zero), sq.sum()
    if d < _MIN_COMPILED_D:  # numpy, as before
        o[HEAD:HEAD + d] = x.sum(axis=0)
        x = x / np.where(zero, 1.0, norm)[:, None]
        o[HEAD + d:HEAD + 2 * d] = x.sum(axis=0)
        np.square(x, out=x)
        o[HEAD + 2 * d:] = x.sum(axis=0)
        return o
    _column_sums(x, np.where(zero, 1.0, norm), o[HEAD:HEAD + d], o[HEAD + d:HEAD + 2 * d], o[HEAD + 2 * d:])
    return o


@njit(cache=True, nogil=True)
def _column_sums(x, denom, s1, su, su2):  # pragma: no cover - compiled
    """Σx, Σ x/denom and Σ (x/denom)² over the rows of ``x``, each column from 0.0 in row order."""
    n, d = x.shape
    for j in range(d):
        s1[j] = 0.0
        su[j] = 0.0
        su2[j] = 0.0
    for i in range(n):
        r = denom[i]
        for j in range(d):
            v = x[i, j]
            u = v / r
            a, b, c = s1[j], su[j], su2[j]
            # a NaN sum stays that NaN (x86 keeps the first operand's NaN, numpy's SIMD loop adds sum + row)
            s1[j] = a if a != a else a + v
            su[j] = b if b != b else b + u
            su2[j] = c if c != c else c + u * u


@njit(cache=True, nogil=True)
def _widen_bf16(raw, out, scratch):  # pragma: no cover - compiled
    """bfloat16 bit patterns (uint16) as float64 into ``out`` (exact: the high half of a float32)."""
    n, d = raw.shape
    f = scratch.view(np.float32)
    for i in range(n):
        for j in range(d):
            scratch[j] = np.uint32(raw[i, j]) << np.uint32(16)
        for j in range(d):
            out[i, j] = f[j]


def _widened(raw: np.ndarray, dtype: str) -> np.ndarray:
    """``widen(raw, dtype)`` as a new C-contiguous float64 array, bfloat16 in one compiled pass."""
    if dtype == "bfloat16" and raw.ndim == 2 and raw.dtype == np.uint16:
        out = np.empty(raw.shape, dtype=np.float64)
        _widen_bf16(np.ascontiguousarray(raw), out, np.empty(raw.shape[1], dtype=np.uint32))
        return out
    return np.ascontiguousarray(widen(raw, dtype))


def block_sums(block: np.ndarray, dtype: str, groups: np.ndarray, n_groups: int = len(GROUPS)) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # NaN/inf states: NaN sums, flagged elsewhere
        return _block_sums(block, dtype, groups, n_groups)


def _block_sums(block: np.ndarray, dtype: str, groups: np.ndarray, n_groups: int = len(GROUPS)) -> np.ndarray:
    """``(group, 3 + 3 d)`` float64 sums of one layer block ``(token, d)`` in the storage dtype.

    Per chunk of :data:`CHUNK_ROWS` rows, the sums of every row and those of the rows outside group 0
    (few: special tokens and window starts) are taken; group 0's are their difference — a fixed order
    of float64 operations, so the same bytes always give the same sums."""
    n, d = block.shape
    out = np.zeros((n_groups, HEAD + 3 * d), dtype=np.float64)
    for lo in range(0, n, CHUNK_ROWS):
        g = groups[lo:lo + CHUNK_ROWS]
        raw = block[lo:lo + CHUNK_ROWS]
        rest = np.flatnonzero(g)
        group_rest = np.zeros_like(out)
        for k in range(1, n_groups):
            rows = rest[g[rest] == k]
            if len(rows):
                group_rest[k] = _sums(_widened(raw[rows], dtype), d)
        total = _sums(_widened(raw, dtype), d)
        out[0] += total - group_rest[1:].sum(axis=0)
        out[1:] += group_rest[1:]
    return out


def shard_sums(blocks, dtype: str, groups: np.ndarray, n_groups: int = len(GROUPS)) -> np.ndarray:
    """``(group, layer, 3 + 3 d)`` from one shard's layer blocks of a site (an iterable of arrays)."""
    return np.stack([block_sums(b, dtype, groups, n_groups) for b in blocks], axis=1)


def to_layer_stats(site: str, layers, sums: np.ndarray, groups) -> LayerStats:
    """LayerStats of the tokens of ``groups`` (indices into the first axis of ``sums``)."""
    tot = sums[list(groups)].sum(axis=0)  # (layer, 3 + 3d)
    d = (tot.shape[1] - HEAD) // 3
    counts = tot[:, 0]
    if len(counts) and not np.all(counts == counts[0]):
        raise StoreCorruptError(f"the {site} statistics count different tokens per layer: {counts.tolist()}")
    return LayerStats(site=site, layers=np.asarray([NO_LAYER if l is None else l for l in layers], dtype=np.int64),
                      n=int(round(counts[0])) if len(counts) else 0, shift=np.zeros((len(tot), d)),
                      s1=tot[:, HEAD:HEAD + d].copy(), s2=None, sq_norm=tot[:, 2].copy(),
                      su=tot[:, HEAD + d:HEAD + 2 * d].copy(), su2=tot[:, HEAD + 2 * d:].copy(),
                      n_zero=tot[:, 1].round().astype(np.int64))


def groups_of(drop_special: bool, min_pos: int) -> list[int] | None:
    """The groups whose union is ``store.mask(drop_special, min_pos)``, or None when it is no union of them."""
    if min_pos not in (0, 1):
        return None
    return [i for i, (special, first) in enumerate(GROUPS)
            if not (drop_special and special) and not (min_pos == 1 and first)]


def read_shard_stats(files, shard: ShardEntry | dict, site: str, n_layers: int, width: int) -> np.ndarray:
    """One shard's recorded sums of ``site``, checked (size, CRC-32, header) before numpy parses them."""
    shard = ShardEntry.from_dict(shard)
    fname = stats_file(site)
    meta = (shard.stats or {}).get(fname)
    if meta is None:
        raise StoreCorruptError(f"shard {shard.name} lists no {fname}")
    path = Path(files.root) / "shards" / shard.name / fname
    want = (len(GROUPS), n_layers, HEAD + 3 * width)
    try:
        size = path.stat().st_size
        if size != meta["bytes"]:
            raise StoreCorruptError(f"{path}: has {size} bytes, the manifest says {meta['bytes']}")
        got = crc32_file(path)
        if got != meta["crc32"]:
            raise StoreCorruptError(f"{path}: fails its checksum (crc32 {got}, manifest {meta['crc32']}): "
                                    "the file is damaged")
        with open(path, "rb") as fh:
            header = parse_header(fh, str(path))
        if header.dtype != np.dtype("<f8") or header.fortran_order or header.shape != want:
            raise StoreCorruptError(f"{path}: .npy header says dtype {header.dtype.str}, shape {header.shape}; "
                                    f"expected <f8, shape {want}")
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise StoreCorruptError(f"{path}: file is missing (shard {shard.name} lists it)") from None
    except (OSError, ValueError) as exc:
        raise StoreCorruptError(f"{path}: cannot be read ({exc})") from None


def has_recorded(manifest: Manifest | dict, site: str) -> bool:
    """Whether every shard of the store records statistics of ``site`` (:meth:`Manifest.has_stats`)."""
    return Manifest.from_dict(manifest, validate=False).has_stats(site)


def store_stats(store, site: "Site | str", drop_special: bool = True, min_pos: int = 0) -> LayerStats:
    """The statistics of ``site`` over the tokens of ``store.mask(drop_special, min_pos)``: added up from
    the shards' recorded sums when the store has them (no pass over the states), else computed from
    the stored rows in one streaming pass (one layer block of one shard in memory at a time)."""
    m: Manifest = store.manifest
    parsed = m.site(site)  # a site the store does not hold: one line listing its sites
    name, layers = parsed.value, list(m.sites[parsed])
    width = m.width(parsed)
    wanted = groups_of(drop_special, min_pos)
    store.mask(drop_special, min_pos)  # refuses a mask that keeps no token, as every analysis does
    if store.root is not None and wanted is not None and m.has_stats(parsed):
        total = None
        for shard in m.shards:
            s = read_shard_stats(store._files, shard, name, len(layers), width)
            total = s if total is None else total + s
        return to_layer_stats(name, layers, total, wanted)
    return _computed(store, name, layers, drop_special, min_pos)


def _computed(store, name: str, layers: list, drop_special: bool, min_pos: int) -> LayerStats:
    wanted = groups_of(drop_special, min_pos)
    if wanted is None:  # two groups: the mask's tokens and the others
        groups_all, n_groups, wanted = (~store.mask(drop_special, min_pos)).astype(np.int8), 2, [0]
    else:
        groups_all, n_groups = token_groups(store.tokens["special"], store.tokens["pos"]), len(GROUPS)
    dtype = store.dtype
    total = None
    if store.root is not None:
        start = 0
        for shard in store.manifest.shards:
            n = shard.n_tokens
            g = groups_all[start:start + n]
            blocks = (store._files.layer_block(shard, name, i) for i in range(len(layers)))
            s = shard_sums(blocks, dtype, g, n_groups)
            total = s if total is None else total + s
            start += n
    else:
        blocks = (to_storage(store.get(name, l), dtype) for l in layers)
        total = shard_sums(blocks, dtype, groups_all, n_groups)
    return to_layer_stats(name, layers, total, wanted)
