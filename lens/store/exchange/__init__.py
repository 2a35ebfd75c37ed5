"""The store in the field's formats, and hidden states captured elsewhere as stores (issue 39).

The store (``.npy`` layer blocks, a sealed manifest, checksums) stays the canonical form; around it:

* :mod:`.safetensors_io` — shards of safetensors files (the stored dtype kept: bfloat16 as BF16), the token
  table as tensors, ``__metadata__`` naming the source store; read back with ``safetensors.safe_open`` alone.
* :mod:`.saelens` — a Hugging Face ``datasets`` activation cache in the layout of SAELens'
  ``CacheActivationsRunner`` (one folder per site and layer), and the reading of such a cache.
* :mod:`.zarr_io` — a zarr v3 group, one sharded array per site (layer, token, d_model) with crc32c, the
  token table as coordinates, the manifest as attributes (xarray, dask, tensorstore read it lazily).
* :mod:`.vllm` — the hidden-states files of vLLM's ``extract_hidden_states`` connector.
* :mod:`.lazy` — ``Store.to_dask`` / ``Store.to_xarray``.
* :mod:`.importer` — any of those sources written as a checked store (the commit protocol of
  :mod:`lens.store.writer`).

Every export is written into a hidden staging folder beside ``--out`` and renamed onto it only when every
file was written, fsynced, read back and checked (:mod:`.staging`): a half-written export never reads as whole.
The fidelity check of an import needs a model forward, which lives in a later wing
(:mod:`lens.capturing.exchange`).
"""
