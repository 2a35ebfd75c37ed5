"""How many bytes a capture will write, known before it starts, and whether the disk can hold them.

A store's size follows from its plan alone: per shard, one ``.npy`` file per site of
``layers × rows × width`` values of the stored dtype behind a header of known length, the token table's
columns (six int64, one bool, the token text as fixed-width unicode), one float64 ``stats.<site>.npy`` per
site (:mod:`lens.store.stats`: groups × layers × (3 + 3 width) sums), and the manifest, whose entries
per shard have a fixed form. :func:`plan_size` adds these up exactly (the manifest's checksums are
counted at their fixed width), so the estimate is the bytes written to within a few bytes of JSON.

:func:`check_space` compares what a run still has to write (a resumed capture: only the shards not
committed yet) with the free space of the filesystem that will hold ``--out`` (its nearest existing
folder) and refuses with :class:`NotEnoughSpace` (exit 2) before any state is computed.

Test hook: ``LENS_FREE_SPACE_BYTES`` (read in :func:`free_bytes` only) replaces the free space the
filesystem reports, so the refusal can be tested without filling a disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lens.errors import StoreWriteError
from lens.store.fsio import FREE_SPACE_ENV, free_bytes, human_bytes
from lens.store.format import TOKEN_COLUMNS, storage_np_dtype
from lens.store.manifest import Manifest, ShardEntry
from lens.store.npyfile import header_bytes
from lens.store.stats import GROUPS, HEAD, stats_file

BLOCK = 4096  # a file may take up to one filesystem block more than its bytes
_CRC = "00000000"


class NotEnoughSpace(StoreWriteError):
    """The filesystem that would hold a store has less free space than the capture will write."""


@dataclass(frozen=True)
class CaptureSize:
    """The bytes of a capture's store. ``activations`` / ``token_table`` / ``manifest``: of the complete
    store; ``to_write``: what this run still writes (less on resume); ``n_files``: files it creates."""

    n_tokens: int
    n_blocks: int       # site-layer blocks per token
    width: int          # d_model (the widest site)
    itemsize: int
    activations: int
    token_table: int
    manifest: int
    to_write: int
    n_files: int
    stats: int = 0      # the per-shard statistics files (lens.store.stats)

    @property
    def total(self) -> int:
        return self.activations + self.token_table + self.stats + self.manifest

    @property
    def need(self) -> int:
        """Free space this run needs: its bytes plus a block per file for the filesystem's rounding."""
        return self.to_write + self.n_files * BLOCK

    def describe(self) -> str:
        resumed = "" if self.to_write >= self.total else f", {human_bytes(self.to_write)} of it still to write"
        return (f"{human_bytes(self.total)} = {self.total} bytes ({self.n_tokens} tokens x {self.n_blocks} site-layers x d {self.width} x "
                f"{self.itemsize} B = {human_bytes(self.activations)} + token table "
                f"{human_bytes(self.token_table)} + statistics {human_bytes(self.stats)} + manifest "
                f"{human_bytes(self.manifest)}{resumed})")


def _npy(dtype, shape) -> int:
    dtype = np.dtype(dtype)
    return len(header_bytes(dtype, shape)) + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _column_dtypes(text_width: int) -> dict:
    return {c: (np.dtype("|b1") if c == "special" else np.dtype(f"<U{max(1, text_width)}") if c == "token"
                else np.dtype("<i8")) for c in TOKEN_COLUMNS}


def plan_size(manifest: Manifest, shards: list[tuple[int, int, int]], n_done: int, text_width: int) -> CaptureSize:
    """The size of the store ``manifest`` describes once ``shards`` — ``(window_start, window_end, rows)``
    of every shard of the plan, in order, the first ``n_done`` already committed — are written.
    ``text_width``: characters of the token text column (its longest token)."""
    dtype = storage_np_dtype(manifest.dtype)
    sites = {s.value: layers for s, layers in manifest.sites.items()}
    columns = _column_dtypes(text_width)
    entries, act, table, act_todo, stats, stats_todo = [], 0, 0, 0, 0, 0
    for i, (lo, hi, n) in enumerate(shards):
        files = {}
        for site, layers in sites.items():
            shape = (len(layers), n, manifest.width(site))
            size = _npy(dtype, shape)
            files[f"{site}.npy"] = {"bytes": size, "header_bytes": len(header_bytes(dtype, shape)),
                                    "header_crc32": _CRC, "layer_crc32": [_CRC] * len(layers)}
            act += size
            act_todo += size if i >= n_done else 0
        for col, cdt in columns.items():
            size = _npy(cdt, (n,))
            files[f"tokens.{col}.npy"] = {"bytes": size, "crc32": _CRC}
            table += size
        sums = {}
        for site, layers in sites.items():
            size = _npy("<f8", (len(GROUPS), len(layers), HEAD + 3 * manifest.width(site)))
            sums[stats_file(site)] = {"bytes": size, "crc32": _CRC}
            stats += size
            stats_todo += size if i >= n_done else 0
        entries.append(ShardEntry.build(f"{i:05d}", n, lo, hi, files=dict(sorted(files.items())), stats=sums,
                                        nonfinite={s: [0] * len(l) for s, l in sites.items()}))
    # the complete store's manifest, its checksum at its fixed width
    final = manifest.with_(shards=entries, n_tokens=int(sum(n for _, _, n in shards)), complete=True,
                           checksum="0" * 64)
    manifest_bytes = len(json.dumps(final.to_dict(), indent=1))
    table_todo = sum(_npy(cdt, (n,)) for _, _, n in shards[n_done:] for cdt in columns.values())
    n_blocks = sum(len(l) for l in sites.values())
    return CaptureSize(n_tokens=final.n_tokens, n_blocks=n_blocks,
                       width=max(manifest.width(s) for s in sites), itemsize=dtype.itemsize,
                       activations=act, token_table=table, manifest=manifest_bytes, stats=stats,
                       to_write=act_todo + table_todo + stats_todo + manifest_bytes,
                       n_files=(len(shards) - n_done) * (2 * len(sites) + len(columns)) + 2)


def check_space(size: CaptureSize, root) -> int:
    """Refuse (:class:`NotEnoughSpace`) a capture whose store cannot fit where ``root`` lies; returns
    the free bytes there."""
    free = free_bytes(root)
    if free < size.need:
        raise NotEnoughSpace(
            f"the capture into {root} would write {human_bytes(size.to_write)} but its filesystem has "
            f"{human_bytes(free)} free (store: {size.describe()}): free some space, choose another --out, keep "
            "fewer rows (--positions last or every:K, fewer --layers or --sites, --dtype float16), or pass "
            "--no-space-check to capture anyway")
    return free


__all__ = ["CaptureSize", "NotEnoughSpace", "plan_size", "free_bytes", "check_space", "human_bytes",
           "FREE_SPACE_ENV"]
