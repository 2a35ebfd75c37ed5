"""vLLM's hidden-states files as an import source.

What the files are (vLLM's source, vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py):
``ExampleHiddenStatesConnector`` — used with the ``extract_hidden_states`` speculative method — writes one
safetensors file per request, ``<shared_storage_path>/<request id>.safetensors`` (``build_connector_meta``), with
``save_file({"hidden_states": ..., "token_ids": ...})`` (``_write_tensors`` / ``_submit_async_write``):

* ``token_ids`` (token,): the prompt's token ids (``request_finished``; with ``include_output_tokens`` all tokens
  but the last, whose state was never computed);
* ``hidden_states`` (token, n_ids, hidden_size): ``extract_from_kv_cache`` (line 36-45 at vllm-project/vllm
  015a95c8bdd8) indexes the cache-only layer's KV cache ``[num_blocks, num_heads, block_size, head_size]`` (line 319)
  as ``kv_cache[slot // block_size, :, slot % block_size]``, the "heads" being the hidden states of the layers listed
  in ``eagle_aux_hidden_state_layer_ids`` (in that order, line 198) and ``head_size`` the model's hidden size; the
  dict is built at line 416 and written by ``save_file`` at line 343, to ``<request id>.safetensors`` (line 497).
  The connector's first version (806715ec00d5, line 50-63, ``reshape_hidden_states_from_kv_cache``) stacked the
  states layer first, (n_ids, token, hidden_size); such files are read too, told apart by which axis has the
  file's token count (when both have it, the current order is assumed and the fidelity check would refuse a wrong
  guess).

Which layer an id is (vllm/model_executor/models/interfaces.py, ``EagleModelMixin._maybe_add_hidden_state``, which
each model's forward calls with 0 before its first decoder layer and with ``l + 1`` after layer ``l``, e.g.
vllm/model_executor/models/llama.py ``LlamaModel.forward``): id ``i`` is ``hidden_states + residual`` *before*
decoder layer ``i`` — the input of block ``i``, Hugging Face's ``hidden_states[i]`` (for the last id, the layer
count, the last block's output before the final norm, where Hugging Face's last entry is after it). So id
``i >= 1`` is our ``resid_post`` of layer ``i - 1``; an import with an id 0 among them stores ``resid_pre`` of layer
``i`` instead (id 0 is the embedding), and every id must be below the model's layer count then.

The layer ids are not in the files: the import takes them (``--layers``, the ids given to vLLM). Each file (each
request) is a window and a document of its own. A ``.lock`` beside a file is vLLM's write lock and is ignored; a
``.safetensors.zst`` (the online connector's compressed output) must be decompressed first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lens.errors import LensInputError, StoreCorruptError
from lens.store.exchange.importer import Piece, Source, window_tokens
from lens.store.exchange.safetensors_io import _open, _storage

DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}  # safetensors' names


def parse_ids(layers) -> list[int]:
    if layers is None:
        raise LensInputError("an import from vllm needs --layers: the layer ids the files hold, in order (the "
                             "eagle_aux_hidden_state_layer_ids given to vLLM)")
    if isinstance(layers, str):
        try:
            ids = [int(x) for x in layers.split(",") if x.strip()]
        except ValueError:
            raise LensInputError(f"--layers expects the layer ids as integers (e.g. 1,2,3), got {layers!r}") from None
    else:
        ids = [int(x) for x in layers]
    if not ids or any(b <= a for a, b in zip(ids, ids[1:])) or ids[0] < 0:
        raise LensInputError(f"--layers {layers!r}: the ids must be non-negative and increasing, as vLLM lists them")
    return ids


def site_layers(ids: list[int], n_layers: int) -> tuple[str, list[int]]:
    """(site, layers) of vLLM's layer ids (see the module docstring)."""
    if ids[-1] > n_layers:
        raise LensInputError(f"layer id {ids[-1]} does not exist in a model of {n_layers} layers (ids run 0..{n_layers}): "
                             "a file of another model, or other --layers")
    if ids[0] >= 1:
        return "resid_post", [i - 1 for i in ids]
    if ids[-1] >= n_layers:
        raise LensInputError(f"layer ids {ids} mix the embedding (0) and the last layer's output ({n_layers}): import "
                             "them in two stores")
    return "resid_pre", list(ids)


def _check_file(p: Path, ids: list, card: dict) -> tuple[int, str, bool]:
    """(tokens, storage dtype, whether the layer axis comes first) of one vLLM hidden-states file, refused unless it
    holds ``ids``' layers of ``card``'s model in a dtype a store keeps."""
    with _open(p) as fh:
        keys = set(fh.keys())
        if not {"hidden_states", "token_ids"} <= keys:
            raise LensInputError(f"{p}: not a vLLM hidden-states file (it holds {', '.join(sorted(keys))}; expected "
                                 "hidden_states and token_ids)")
        h = fh.get_slice("hidden_states")
        shape = tuple(h.get_shape())
        t_dtype = DTYPES.get(h.get_dtype())
        n_ids = len(fh.get_tensor("token_ids"))
    layer_first = len(shape) == 3 and shape[1] == n_ids and (shape[0] != n_ids or shape[1] != len(ids))
    if len(shape) != 3 or n_ids not in shape[:2]:
        raise StoreCorruptError(f"{p}: hidden_states has shape {shape}, expected (tokens={n_ids}, layers, hidden)")
    per_token = shape[0] if layer_first else shape[1]
    if per_token != len(ids):
        raise LensInputError(f"{p}: holds {per_token} hidden states per token, --layers names {len(ids)}")
    if shape[2] != card["d_model"]:
        raise LensInputError(f"{p}: a file of another model: hidden size {shape[2]}, {card['model_id']} has d_model "
                             f"{card['d_model']}")
    if t_dtype is None:
        raise LensInputError(f"{p}: hidden_states of dtype {h.get_dtype()}: a store keeps float32, float16 or bfloat16")
    return n_ids, t_dtype, layer_first


def read_vllm(src, layers, card: dict) -> Source:
    """vLLM hidden-states files (a folder of them, or one) as an import :class:`Source` for ``card``'s model."""
    src = Path(src)
    if not src.exists():
        raise LensInputError(f"{src}: not found (expected vLLM's hidden-states files: <request id>.safetensors)")
    paths = sorted(src.glob("*.safetensors")) if src.is_dir() else [src]
    if not paths:
        zst = sorted(src.glob("*.safetensors.zst")) if src.is_dir() else []
        raise LensInputError(f"{src}: holds no .safetensors file" + (" (only .zst-compressed ones: decompress them "
                                                                      "with zstd -d first)" if zst else ""))
    ids = parse_ids(layers)
    site, store_layers = site_layers(ids, int(card["n_layers"]))
    files, dtype, n_tokens, longest, layer_first = [], None, 0, 0, set()
    for p in paths:
        n_ids, t_dtype, first = _check_file(p, ids, card)
        if dtype not in (None, t_dtype):
            raise LensInputError(f"{p}: hidden states in {t_dtype}, the files before it in {dtype}")
        dtype = t_dtype
        if n_ids:
            files.append((p, n_ids))
            if first:
                layer_first.add(p)
            n_tokens += n_ids
            longest = max(longest, n_ids)
    if not files:
        raise LensInputError(f"{src}: every file is empty (no token)")
    record = {"from": "vllm", "path": str(src.resolve()), "files": len(files), "layer_ids": ids,
              "mapping": f"vLLM layer id i -> {site} layer {'i-1' if site == 'resid_post' else 'i'}",
              "fingerprint": f"{len(files)} files, {n_tokens} tokens"}
    if layer_first:
        record["layer_first_files"] = len(layer_first)  # the connector's first layout, (layer id, token, hidden)

    def load(p: Path) -> tuple[np.ndarray, np.ndarray]:
        with _open(p) as fh:
            hs = _storage(fh.get_tensor("hidden_states"))
            hs = hs if p in layer_first else hs.transpose(1, 0, 2)
            return fh.get_tensor("token_ids").numpy().astype(np.int64), np.ascontiguousarray(hs)

    def token_ids(p: Path) -> np.ndarray:
        with _open(p) as fh:
            return fh.get_tensor("token_ids").numpy().astype(np.int64)

    def probes(k: int = 2):
        return [(ids_, {site: hs}) for ids_, hs in (load(p) for p, _ in files[:k])]

    def pieces(shard_tokens: int, special):
        groups, cur, size = [], [], 0
        for j, (p, n) in enumerate(files):
            if cur and size + n > shard_tokens:
                groups.append(cur)
                cur, size = [], 0
            cur.append(j)
            size += n
        groups.append(cur)
        for g in groups:
            def chunks(g=g):
                row = 0
                for j in g:
                    _, hs = load(files[j][0])
                    yield row, {(site, k): hs[k] for k in range(hs.shape[0])}
                    row += hs.shape[1]

            def tokens(g=g):
                return window_tokens([token_ids(files[j][0]) for j in g], g[0], special)

            yield Piece(g[0], g[-1] + 1, sum(files[j][1] for j in g), tokens=tokens, chunks=chunks)

    return Source(sites={site: store_layers}, dtype=dtype, n_windows=len(files), n_tokens=n_tokens, seq_len=longest,
                  record=record, probes=probes, pieces=pieces)


__all__ = ["read_vllm", "parse_ids", "site_layers"]
