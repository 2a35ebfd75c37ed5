"""``Store.to_dask(site)`` and ``Store.to_xarray(site)``: a store's states as lazy arrays.

One dask chunk per layer and store shard: computing one reads that shard's layer block from disk (memory-mapped,
its CRC checked on first read, as ``Store.get`` reads it) and nothing else. A store held in memory or on a device
(``lens.capture`` without ``out``, or moved with ``store.to(device)``) gives one chunk per layer,
copied to host memory when computed. Axes: ``(layer, token, d_model)`` for
a per-layer site, ``(token, d_model)`` for ``embed`` / ``final_norm``. bfloat16 states (stored as ``uint16`` bit
patterns, which no array library reads as numbers) come as float32, widened exactly; float32 and float16 as stored.
The xarray form carries the layers as the ``layer`` coordinate and the token table as coordinates along ``token``
(``doc``, ``window``, ``pos``, ``doc_pos``, ``token_id``, ``next_token_id``, ``special``, ``token_text``).
"""

from __future__ import annotations

import numpy as np
import torch

from lens.errors import LensInputError
from lens.sites import Site
from lens.store.exchange.selection import select, widen
from lens.store.format import TOKEN_COLUMNS, site_width
from lens.store.shardfiles import ShardFiles


def value_dtype(dtype: str) -> np.dtype:
    """The numpy dtype a lazy or exported array holds for a store dtype (bfloat16 widened to float32)."""
    return np.dtype(np.float32 if dtype == "bfloat16" else dtype)


def _read(root, manifest, shard_index: int, site: str, idx: int) -> np.ndarray:
    files = ShardFiles(root, manifest, verify=True)
    return widen(np.array(files.layer_block(manifest["shards"][shard_index], site, idx)), manifest["dtype"])


def _held(store, site: str, layer) -> np.ndarray:
    x = store.get(site, layer)
    return (x.float() if x.dtype == torch.bfloat16 else x).cpu().numpy()


def to_dask(store, site="resid_post", layers=None):
    """``site``'s states as a lazy dask array (see the module docstring)."""
    import dask  # lazy: dask and xarray take ~1 s to import, and every Store import reaches this module
    import dask.array as da  # lazy: as above

    m = store.manifest
    name = Site.parse(site).value
    blocks = select(m, [name], layers)
    if store.root is None:  # held in memory (or on a device): a chunk per layer, to the host when computed
        held = dask.delayed(_held, pure=True)
        shape = (int(store.n_tokens), site_width(m, name))
        per_layer = [da.from_delayed(held(store, name, b.layer), shape=shape, dtype=value_dtype(m["dtype"]))
                     for b in blocks]
        return da.stack(per_layer) if Site(name).per_layer else per_layer[0]
    if not m["shards"]:
        raise LensInputError(f"store {store.root} holds no complete shard yet")
    width = site_width(m, name)
    dtype = value_dtype(m["dtype"])
    read = dask.delayed(_read, pure=True)
    per_layer = []
    for b in blocks:
        parts = [da.from_delayed(read(store.root, m, i, name, b.idx), shape=(int(s["n_tokens"]), width), dtype=dtype)
                 for i, s in enumerate(m["shards"])]
        per_layer.append(da.concatenate(parts, axis=0) if len(parts) > 1 else parts[0])
    return da.stack(per_layer) if Site(name).per_layer else per_layer[0]


def token_coords(tokens: dict) -> dict:
    return {("token_text" if c == "token" else c): ("token", np.asarray(tokens[c])) for c in TOKEN_COLUMNS}


def to_xarray(store, site="resid_post", layers=None):
    """``site``'s states as a lazy ``xarray.DataArray`` with its layers and token table as coordinates."""
    import xarray as xr  # lazy: as in to_dask

    name = Site.parse(site).value
    data = to_dask(store, name, layers)
    coords = token_coords(store.tokens)
    if Site(name).per_layer:
        dims = ("layer", "token", "d_model")
        coords["layer"] = [b.layer for b in select(store.manifest, [name], layers)]
    else:
        dims = ("token", "d_model")
    m = store.manifest
    attrs = {"model_id": m["model"]["model_id"], "revision": str(m["model"].get("revision")), "site": name,
             "stored_dtype": m["dtype"], "store": "in memory" if store.root is None else str(store.root),
             "manifest_sha256": m.get("manifest_sha256") or ""}
    return xr.DataArray(data, dims=dims, coords=coords, name=name, attrs=attrs)


__all__ = ["to_dask", "to_xarray", "value_dtype"]
