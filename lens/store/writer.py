"""Streaming writer: fills one shard at a time in a ``.partial`` directory through memory-mapped
``.npy`` files, then checksums it, renames it into place and rewrites the manifest atomically.

Memory stays flat however many tokens are captured (one shard's pages at most), a reader never
sees a half-written shard, and a crashed capture resumes after its last complete shard.
"""

from __future__ import annotations

import shutil
import zlib
from pathlib import Path

import numpy as np

from lens.store.format import (DTYPES, MANIFEST, PARTIAL, SHARDS, TOKEN_COLUMNS, crc32_file, fsync_dir,
                               to_storage, write_json_atomic)


class ShardWriter:
    """Writes the shards of one store. ``manifest`` is the dict from :func:`lens.capture`."""

    def __init__(self, root: Path, manifest: dict):
        self.root = Path(root)
        self.manifest = manifest
        (self.root / SHARDS).mkdir(parents=True, exist_ok=True)
        for stale in (self.root / SHARDS).glob(f"*{PARTIAL}"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a crash; rewritten from scratch
        self._open = None

    def commit_manifest(self) -> None:
        write_json_atomic(self.root / MANIFEST, self.manifest)

    def begin(self, window_start: int, window_end: int, n_tokens: int) -> None:
        index = len(self.manifest["shards"])
        name = f"{index:05d}"
        path = self.root / SHARDS / (name + PARTIAL)
        path.mkdir(parents=True)
        _, np_dtype, _ = DTYPES[self.manifest["dtype"]]
        arrays = {}
        for site, layers in self.manifest["sites"].items():
            arrays[site] = np.lib.format.open_memmap(
                path / f"{site}.npy", mode="w+", dtype=np_dtype,
                shape=(len(layers), n_tokens, self.manifest.get("widths", {}).get(site, self.manifest["d_model"])))
        self._open = {"name": name, "path": path, "arrays": arrays, "fill": 0, "n_tokens": n_tokens,
                      "window_start": window_start, "window_end": window_end}

    def add_batch(self, states: dict, layer_index: dict, n: int) -> None:
        """``states``: hook key -> tensor (n, d_model) of real (unpadded) tokens, in order."""
        cur = self._open
        lo, hi = cur["fill"], cur["fill"] + n
        for key, value in states.items():
            site, idx = layer_index[key]
            cur["arrays"][site][idx, lo:hi] = to_storage(value, self.manifest["dtype"])
        cur["fill"] = hi

    def finish(self, token_rows: dict) -> None:
        cur = self._open
        if cur["fill"] != cur["n_tokens"]:
            raise RuntimeError(f"shard {cur['name']} got {cur['fill']} tokens, planned {cur['n_tokens']}")
        layer_crcs = {}
        for site, arr in cur["arrays"].items():
            arr.flush()
            # one CRC per layer block, so reading one layer verifies only the bytes it reads
            layer_crcs[f"{site}.npy"] = [f"{zlib.crc32(memoryview(np.ascontiguousarray(arr[i])).cast('B')):08x}"
                                         for i in range(arr.shape[0])]
        del cur["arrays"]
        for col in TOKEN_COLUMNS:
            np.save(cur["path"] / f"tokens.{col}.npy", np.asarray(token_rows[col]), allow_pickle=False)
        files = {}
        for f in sorted(cur["path"].iterdir()):
            files[f.name] = {"crc32": crc32_file(f), "bytes": f.stat().st_size}
            if f.name in layer_crcs:
                files[f.name]["layer_crc32"] = layer_crcs[f.name]
        fsync_dir(cur["path"])
        final = self.root / SHARDS / cur["name"]
        cur["path"].rename(final)
        fsync_dir(final.parent)
        self.manifest["shards"].append({
            "name": cur["name"], "n_tokens": cur["n_tokens"], "window_start": cur["window_start"],
            "window_end": cur["window_end"], "files": files})
        self.manifest["n_tokens"] = int(sum(s["n_tokens"] for s in self.manifest["shards"]))
        self.commit_manifest()
        self._open = None
