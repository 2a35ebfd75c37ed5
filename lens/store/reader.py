"""One read API for stores on disk (memory-mapped), in host memory, or on a GPU."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import torch

from lens.errors import LensInputError, StoreCorruptError
from lens.sites import HookSite, Site
from lens.store.format import (DTYPES, MANIFEST, SHARDS, TOKEN_COLUMNS, crc32_file, from_storage,
                               read_manifest)


class Store:
    """Activations at hook sites for a table of tokens.

    ``get(layer, site)`` returns a tensor (token, d_model) on the store's device; ``tokens`` is a
    dict of numpy columns (one row per token): doc, window, pos, doc_pos, token_id, token,
    next_token_id, special.
    """

    def __init__(self, manifest: dict, tokens: dict, *, root: Path | None = None, arrays=None,
                 device: str | None = None, verify: bool = True):
        self.manifest = manifest
        self.tokens = tokens
        self.root = Path(root) if root is not None else None
        self.device = device
        self._arrays = arrays  # site -> tensor (layers, tokens, d) when held in memory
        self._verify = verify
        self._verified: set = set()

    # ------------------------------------------------------------------ description
    @property
    def model_id(self) -> str:
        return self.manifest["model"]["model_id"]

    @property
    def card(self):
        """The typed model card of the model this store was captured from (:class:`lens.card.ModelCard`)."""
        from lens.card import ModelCard

        return ModelCard.from_dict(self.manifest["model"])

    @property
    def d_model(self) -> int:
        return int(self.manifest["d_model"])

    @property
    def n_tokens(self) -> int:
        return int(self.manifest["n_tokens"])

    @property
    def dtype(self) -> str:
        return self.manifest["dtype"]

    @property
    def sites(self) -> list[str]:
        return list(self.manifest["sites"])

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    def layers(self, site: "str | Site" = "resid_post") -> list[int]:
        name = Site.parse(site).value
        if name not in self.manifest["sites"]:
            raise LensInputError(f"site {name!r} is not in this store (it has {', '.join(self.sites)})")
        return [int(l) for l in self.manifest["sites"][name] if l is not None]

    def has(self, site: "str | Site", layer: int | None = None) -> bool:
        name = Site.parse(site).value
        if name not in self.manifest["sites"]:
            return False
        return layer is None or layer in self.manifest["sites"][name]

    def __repr__(self) -> str:
        where = self.device or ("disk" if self.root else "memory")
        return (f"Store({self.model_id}, {self.n_tokens} tokens, sites={self.manifest['sites']!r}, "
                f"dtype={self.dtype}, on {where})")

    # ------------------------------------------------------------------ reading
    def _index(self, site: str, layer: int | None) -> int:
        name = Site.parse(site).value
        if name not in self.manifest["sites"]:
            raise LensInputError(f"site {name!r} is not in this store (it has {', '.join(self.sites)})")
        layers = self.manifest["sites"][name]
        if not Site(name).per_layer:
            return 0
        if layer is None:
            raise LensInputError(f"site {name!r} needs a layer (stored: {layers})")
        n_layers = self.manifest["model"]["n_layers"]
        if layer < 0:
            layer += n_layers
        if layer not in layers:
            raise LensInputError(
                f"layer {layer} of {name} is not in this store: stored layers are {layers}")
        return layers.index(layer)

    def get(self, layer: int | None = None, site: "str | Site" = "resid_post", dtype=None) -> torch.Tensor:
        """States of every token at ``site``/``layer``: a tensor (token, d_model)."""
        name = Site.parse(site).value
        idx = self._index(name, layer)
        if self._arrays is not None:
            out = self._arrays[name][idx]
        else:
            parts = [self._shard_layer(s, name, idx) for s in self.manifest["shards"]]
            if not parts:
                raise LensInputError(f"store {self.root} holds no complete shard yet")
            out = from_storage(np.concatenate(parts) if len(parts) > 1 else np.array(parts[0]), self.dtype)
            if self.device:
                out = out.to(self.device)
        return out if dtype is None else out.to(dtype)

    def view(self, site: "str | Site" = "resid_post", layers=None, rows=None, dtype=None):
        """Every (or the given) layer of ``site``, read lazily: :class:`lens.store.views.LayerView`."""
        from lens.store.views import LayerView

        return LayerView(self, site, layers, rows, dtype)

    def mask(self, drop_special: bool = True, min_pos: int = 0) -> np.ndarray:
        """Which tokens enter an analysis (:func:`lens.store.views.token_mask`)."""
        from lens.store.views import token_mask

        return token_mask(self.tokens, drop_special, min_pos)

    def _shard_layer(self, shard: dict, site: str, idx: int) -> np.ndarray:
        fname = f"{site}.npy"
        path = self.root / SHARDS / shard["name"] / fname
        meta = shard["files"].get(fname, {})
        per_layer = "layer_crc32" in meta
        self._check(shard, fname, path, full=not per_layer)
        block = np.load(path, mmap_mode="r", allow_pickle=False)[idx]
        if per_layer and self._verify and (shard["name"], fname, idx) not in self._verified:
            data = np.array(block)  # the one copy we make anyway
            got = f"{zlib.crc32(memoryview(data).cast('B')):08x}"
            if got != meta["layer_crc32"][idx]:
                raise StoreCorruptError(f"checksum mismatch in shard {shard['name']} file {fname} "
                                        f"(layer block {idx}): crc32 {got}, manifest {meta['layer_crc32'][idx]}")
            self._verified.add((shard["name"], fname, idx))
            return data
        return block

    def _check(self, shard: dict, fname: str, path: Path, full: bool = True) -> None:
        meta = shard["files"].get(fname)
        if meta is None:
            raise StoreCorruptError(f"shard {shard['name']} has no {fname} in the manifest")
        if not path.is_file():
            raise StoreCorruptError(f"shard {shard['name']}: file {fname} is missing")
        if path.stat().st_size != meta["bytes"]:
            raise StoreCorruptError(
                f"shard {shard['name']}: {fname} has {path.stat().st_size} bytes, manifest says {meta['bytes']}")
        if full and self._verify and (shard["name"], fname) not in self._verified:
            got = crc32_file(path)
            if got != meta["crc32"]:
                raise StoreCorruptError(
                    f"checksum mismatch in shard {shard['name']} file {fname}: crc32 {got}, manifest {meta['crc32']}")
            self._verified.add((shard["name"], fname))

    def verify(self) -> None:
        """Check every file of every shard against its checksum (raises StoreCorruptError)."""
        if self.root is None:
            return
        for shard in self.manifest["shards"]:
            for fname in shard["files"]:
                self._check(shard, fname, self.root / SHARDS / shard["name"] / fname)

    def to(self, device: str) -> "Store":
        """A copy of this store held in memory on ``device`` ("cpu" or "cuda")."""
        arrays = {s: torch.stack([self.get(l if Site(s).per_layer else None, s) for l in
                                  (self.manifest["sites"][s])]).to(device) for s in self.sites}
        return Store(self.manifest, self.tokens, root=self.root, arrays=arrays, device=device)

    def summary(self) -> list[dict]:
        """Per site and layer: mean norm, mean and max |x| over the tokens (for `lens store info`)."""
        rows = []
        for site in self.sites:
            for layer in self.manifest["sites"][site]:
                x = self.get(layer if Site(site).per_layer else None, site, dtype=torch.float32)
                rows.append({"site": site, "layer": layer, "mean_norm": float(x.norm(dim=-1).mean()),
                             "mean": float(x.mean()), "max_abs": float(x.abs().max())})
        return rows


def _load_tokens(root: Path, manifest: dict, verify: bool) -> dict:
    cols = {c: [] for c in TOKEN_COLUMNS}
    reader = Store(manifest, {}, root=root, verify=verify)
    for shard in manifest["shards"]:
        for c in TOKEN_COLUMNS:
            fname = f"tokens.{c}.npy"
            path = root / SHARDS / shard["name"] / fname
            reader._check(shard, fname, path)
            cols[c].append(np.load(path, allow_pickle=False))
    out = {}
    for c, parts in cols.items():
        out[c] = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64 if c != "token" else str)
    return out


def open_store(path, device: str | None = None, verify: bool = True) -> Store:
    """Open a store folder. ``device=None`` memory-maps it from disk; ``"cpu"`` loads it into host
    memory; ``"cuda"`` loads it onto the GPU. Checksums are verified the first time each file is
    read (``verify=False`` skips that)."""
    root = Path(path)
    if not root.exists():
        raise LensInputError(f"store not found: {root}")
    manifest = read_manifest(root)
    tokens = _load_tokens(root, manifest, verify)
    store = Store(manifest, tokens, root=root, verify=verify)
    if device is not None:
        return store.to(device)
    return store
