"""A store as a zarr v3 group, written and read back by zarr itself.

Layout (``OUT/`` is the group, ``zarr.json`` its metadata):

* one array per exported site, ``(layer, token, d_model)`` (``(token, d_model)`` for ``embed`` / ``final_norm``),
  dimension names ``<site>_layer``, ``token``, ``d_model``; sharded (one shard of ``SHARD_ROWS`` tokens per layer,
  inner chunks of ``CHUNK_ROWS``), every chunk and every shard index sealed with a crc32c codec (zarr checks it
  on each read); float32 and float16 as stored; bfloat16 as float32, widened exactly (zarr v3 has no bfloat16
  data type: ``stored_dtype`` in the array's attributes says so);
* ``<site>_layer`` (int64): the layer numbers, a coordinate of the site's first axis;
* the token table as coordinate arrays along ``token`` (``doc``, ``window``, ``pos``, ``doc_pos``, ``token_id``,
  ``next_token_id``, ``special``, ``token_text`` as variable-length UTF-8), named in each site array's
  ``coordinates`` attribute (CF), so ``xarray.open_zarr(OUT)`` makes them coordinates;
* the group's attributes: ``lens_manifest`` (the store's manifest without its shard list) and ``lens_source``
  (the store's path, model, dtype and ``manifest_sha256``).

``xarray.open_zarr(OUT)``, ``dask.array.from_zarr(OUT, component="resid_post")`` and tensorstore read it lazily.
Every shard is read back through zarr (crc32c checked) right after it is written and compared with the values
written (read from the store, CRC-checked, in a thread one shard ahead), and the token ids after the arrays.
"""

from __future__ import annotations

import warnings
from contextlib import closing
from pathlib import Path

import numpy as np
import zarr
from tqdm.auto import tqdm
from zarr.codecs import Crc32cCodec

from lens.errors import StoreCorruptError
from lens.sites import Site
from lens.store.exchange.lazy import value_dtype
from lens.store.exchange.safetensors_io import source_record
from lens.store.exchange.selection import BlockReader, prefetched, same_bytes, select, widen
from lens.store.exchange.staging import staged
from lens.store.format import CHECKSUM_KEY, TOKEN_COLUMNS, site_width
from lens.store.shardfiles import ShardFiles

CHUNK_ROWS = 1024
SHARD_ROWS = 16 * CHUNK_ROWS


def _coord_name(col: str) -> str:
    return "token_text" if col == "token" else col


def export_zarr(store, out, sites=None, layers=None, progress: bool = False) -> Path:
    """Write ``store`` as the zarr v3 group ``out`` (a new folder); returns it."""
    m = store.manifest
    blocks = select(m, sites, layers)
    n = int(m["n_tokens"])
    dtype = value_dtype(m["dtype"])
    files = ShardFiles(store.root, m, verify=True)
    reader = BlockReader(files, m)  # each block read once, its CRC checked
    by_site: dict = {}
    for b in blocks:
        by_site.setdefault(b.site, []).append(b)
    need = sum(n * site_width(m, b.site) * dtype.itemsize for b in blocks) + n * (8 * 8 + 64) + (1 << 20)
    coords = " ".join(_coord_name(c) for c in TOKEN_COLUMNS)
    bar = tqdm(total=n * len(blocks), unit="tok", desc=f"export {store.root} to zarr", disable=not progress)
    rows = max(1, min(SHARD_ROWS, n))
    chunk = max(1, min(CHUNK_ROWS, rows))
    try:
        with staged(out, need) as tmp, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification.*")
            group = zarr.open_group(str(tmp), mode="w", zarr_format=3)
            group.attrs["lens_manifest"] = {k: v for k, v in m.items() if k not in ("shards", CHECKSUM_KEY)}
            group.attrs["lens_source"] = source_record(store, blocks)
            for col in TOKEN_COLUMNS:
                values = np.concatenate([files.token_column(s, col) for s in m["shards"]])
                arr = group.create_array(_coord_name(col), shape=(n,), chunks=(max(1, min(n, 1 << 16)),),
                                         dtype=str if col == "token" else values.dtype, dimension_names=["token"],
                                         compressors=[Crc32cCodec()])
                arr[:] = values.astype(object) if col == "token" else values
            arrays = {}
            for site, bl in by_site.items():
                width = site_width(m, site)
                per_layer = Site(site).per_layer
                if per_layer:
                    lay = group.create_array(f"{site}_layer", shape=(len(bl),), dtype="int64",
                                             dimension_names=[f"{site}_layer"])
                    lay[:] = np.asarray([b.layer for b in bl], dtype=np.int64)
                shape = ((len(bl),) if per_layer else ()) + (n, width)
                lead = (1,) if per_layer else ()
                arrays[site] = group.create_array(
                    site, shape=shape, chunks=lead + (chunk, width), shards=lead + (rows, width), dtype=dtype,
                    compressors=[Crc32cCodec()], fill_value=0, config={"write_empty_chunks": True},
                    dimension_names=([f"{site}_layer"] if per_layer else []) + ["token", "d_model"],
                    attributes={"coordinates": coords, "stored_dtype": m["dtype"], "layers": [b.layer for b in bl]})

            def slabs():  # read (CRC-checked) and widened in a thread, one whole zarr shard ahead of its writing
                for site, bl in by_site.items():
                    for j, b in enumerate(bl):
                        for lo in range(0, n, rows):
                            hi = min(lo + rows, n)
                            yield site, j, b, lo, hi, widen(reader.rows(b, lo, hi), m["dtype"])

            with closing(prefetched(slabs())) as written:
                for site, j, b, lo, hi, data in written:
                    where = (j, slice(lo, hi)) if Site(site).per_layer else (slice(lo, hi),)
                    arrays[site][where] = data  # whole shards: zarr encodes and writes each once
                    # read back through zarr (every chunk's crc32c checked) while the values written are at hand
                    if not same_bytes(arrays[site][where], data):
                        raise StoreCorruptError(f"{tmp}/{site}: layer {b.layer} rows {lo}..{hi} read back other values "
                                                "than the store holds")
                    bar.update(hi - lo)
            _read_back_tokens(tmp, m, files)
    finally:
        bar.close()
    return Path(out)


def _read_back_tokens(root: Path, m: dict, files) -> None:
    """The token ids read back through zarr and compared with the store's."""
    group = zarr.open_group(str(root), mode="r", zarr_format=3)
    ids = group["token_id"][:]
    if not np.array_equal(ids, np.concatenate([files.token_column(s, "token_id") for s in m["shards"]])):
        raise StoreCorruptError(f"{root}/token_id: reads back other token ids than the store holds")


__all__ = ["export_zarr"]
