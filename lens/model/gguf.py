"""GGUF files: which architectures load, and dequantising one once into an fp32 model folder.

A GGUF file names its architecture in llama.cpp's words (``general.architecture``: ``llama``,
``qwen2moe``, ``gemma3``, ...). The installed ``transformers`` reads a fixed set of them, each into one
of its model types; :func:`architectures` lists that set from transformers itself, less the ones the
workbench refuses (:data:`REFUSED`, each with its reason). Anything else — another architecture, a
file that is not GGUF at all — is refused before transformers sees it, with a one-line
:class:`~lens.errors.LensInputError` naming what the file says and what loads.

A file is dequantised once (:func:`dequantise`): transformers unpacks every tensor into fp32, the
model is checked to have received every one of its weights from the file (a tensor transformers
could not map would otherwise stay at its random initialisation without a word), and it is saved
with its tokenizer as a plain model folder that later loads without the GGUF machinery. A few keys
that size the weights go unread by transformers' reader (:data:`READER_MISSES`); they are read here and
passed on as config fields.

Two naming quirks of transformers' reader, mirrored here so that a refusal can say what a file
would load as: a ``llama`` file whose ``general.name`` is exactly ``mistral`` loads as Mistral, and
``gemma3`` / ``gemma4`` files load as their text-only model types (a GGUF holds the language model
alone).
"""

from __future__ import annotations

import contextlib
import logging
import math
import struct
from pathlib import Path
from types import SimpleNamespace

import torch

from lens.errors import LensInputError
from lens.runtime.atomic import atomic_dir
from lens.model.files import check_bytes, lower_bound_params, memory_check_skipped, size_problem

log = logging.getLogger(__name__)

# transformers' GGUF config tables are keyed by these names where llama.cpp spells the architecture
# otherwise (transformers renames them on reading: modeling_gguf_pytorch_utils.load_gguf_checkpoint).
_LLAMA_CPP_NAME = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss",
                   "minimax_m2": "minimax-m2", "umt5": "t5", "mistral": "llama"}
# the model type a file of each architecture loads as, where it is not the architecture's own name
_MODEL_TYPE = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2",
               "gemma3": "gemma3_text", "gemma4": "gemma4_text", "qwen35": "qwen3_5_text",
               "qwen35moe": "qwen3_5_moe_text", "t5encoder": "t5"}

# Architectures transformers reads from GGUF that the workbench does not load, and why.
REFUSED = {
    "t5": "an encoder-decoder (T5 / UMT5); the workbench loads decoder-only and encoder-only models, and "
          "transformers has no causal-LM class for T5",
    "t5encoder": "a T5 encoder alone (T5EncoderModel); the workbench dequantises GGUF files as causal "
                 "language models, and transformers has no causal-LM class for T5",
    "deci": "transformers has no DeciLM model class (DeciLM runs as remote code), so the file's config "
            "cannot be built",
    "gpt-oss": "a transformers bug: its GGUF reader maps no tensor of the file onto GPT-OSS's stacked experts "
               "(experts.gate_up_proj, experts.down_proj and their biases), which would stay random",
}

# Keys llama.cpp writes, and transformers' GGUF reader does not read, that size the model's weights: the
# reader leaves those config fields at their defaults, which fit some checkpoints of the family (Qwen1.5-MoE,
# Qwen3-30B-A3B, Gemma 4's 256-wide per-layer inputs) and not others (Qwen2-57B-A14B's 2560-wide experts
# fail on mismatched shapes). The workbench reads them from the file and passes them on as config fields.
READER_MISSES = {
    "qwen2moe": {"expert_feed_forward_length": "moe_intermediate_size",
                 "expert_shared_feed_forward_length": "shared_expert_intermediate_size"},
    "qwen3moe": {"expert_feed_forward_length": "moe_intermediate_size"},
    "gemma4": {"embedding_length_per_layer_input": "hidden_size_per_layer_input"},
}


def transformers_architectures() -> dict[str, str]:
    """llama.cpp architecture -> transformers model type, for every architecture the installed
    transformers reads from a GGUF file (its legacy config table and its newer per-architecture
    readers), refused ones included."""
    from transformers.integrations import GGUF_CONFIG_MAPPING  # lazy: import cost (transformers 1.5 s)
    from transformers.integrations.gguf import GGUF_CONFIG_ARCHS  # lazy: import cost (transformers 1.5 s)

    names = {_LLAMA_CPP_NAME.get(k, k) for k in GGUF_CONFIG_MAPPING if k not in ("general", "tokenizer")}
    names |= set(GGUF_CONFIG_ARCHS)
    if "t5" in names:
        names.add("t5encoder")
    return {n: _MODEL_TYPE.get(n, n) for n in sorted(names)}


def architectures() -> dict[str, str]:
    """The architectures ``lens.load_model(path.gguf)`` loads: llama.cpp name -> transformers model type."""
    return {k: v for k, v in transformers_architectures().items() if k not in REFUSED}


def _supported_line() -> str:
    return ", ".join(architectures())


# what transformers' GGUF reader raises on bytes that are not what their header says
_UNREADABLE = (ValueError, struct.error, UnicodeDecodeError, IndexError, OverflowError, MemoryError,
               ZeroDivisionError, TypeError)


def check_magic(path: Path) -> None:
    """A clear error unless ``path`` starts with GGUF's magic bytes (a ``.gguf`` name proves nothing)."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise LensInputError(f"{path} is not a GGUF file: expected it to start with the bytes 'GGUF', "
                             f"found {magic!r}")


def read_metadata(path: Path) -> dict:
    """A GGUF file's metadata (string arrays such as the vocabulary left unread), from its header alone;
    a clear error for anything that is not a readable GGUF file."""
    from transformers.integrations.gguf import read_gguf_metadata  # lazy: import cost (transformers 1.5 s)

    check_magic(path)
    try:
        metadata, _ = read_gguf_metadata(str(path))
    except _UNREADABLE as exc:
        raise LensInputError(f"{path} is not a readable GGUF file: its header is damaged or truncated "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
    return metadata


# llama.cpp's metadata keys (after "<arch>.") that size what transformers builds, and the config field each
# becomes: the value is held to that field's rule (lens.model.files.SIZE_FIELDS, one rule for model folders,
# hub configs and GGUF files). llama.cpp writes 0 for a size a family does not use (Mamba's feed_forward_length
# and head counts) and per-layer arrays where layers differ (LFM2's head_count_kv): zeros pass, except for the
# sizes no model lacks, and an array is held to the rule element by element.
SIZE_KEYS = {
    "block_count": "num_hidden_layers", "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size", "expert_feed_forward_length": "intermediate_size",
    "expert_shared_feed_forward_length": "intermediate_size", "embedding_length_per_layer_input": "hidden_size",
    "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim", "attention.value_length": "head_dim", "rope.dimension_count": "head_dim",
    "context_length": "max_position_embeddings", "vocab_size": "vocab_size",
    "expert_count": "num_local_experts", "expert_used_count": "num_experts_per_tok",
    "ssm.inner_size": "intermediate_size", "ssm.state_size": "hidden_size",
}
NEVER_ZERO = {"block_count", "embedding_length", "vocab_size"}
# the keys the least parameter count is computed from (lens.model.files.lower_bound_params)
_BOUND_KEYS = {"block_count": "num_hidden_layers", "embedding_length": "hidden_size", "vocab_size": "vocab_size"}


def _unreadable(path: Path, exc: BaseException) -> LensInputError:
    return LensInputError(f"{path} is not a readable GGUF file: its tensor table is damaged or truncated "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})")


def quantizer_reads(path: Path) -> bool:
    """Whether transformers' GGUF quantizer (``GgufConfig``) knows every tensor type of the file. Its block table
    lacks some types llama.cpp writes (Q5_0, Q5_1: a Q4_K_M file of a model whose width is not a multiple of
    256 holds them); the ``gguf`` package's reader, behind transformers' plain ``gguf_file=`` load, reads them."""
    from transformers.integrations.gguf.dequant import GGML_BLOCK  # lazy: import cost (transformers 1.5 s)
    from transformers.integrations.gguf.reader import _TORCH_DTYPE  # lazy: import cost (transformers 1.5 s)

    known = set(GGML_BLOCK) | set(_TORCH_DTYPE)
    return all(int(t.tensor_type) in known for t in _gguf_reader(path).tensors)


def _gguf_reader(path: Path):
    import gguf  # lazy: import cost (gguf 0.25 s, for GGUF files only)

    try:
        return gguf.GGUFReader(str(path))
    except _UNREADABLE as exc:
        raise _unreadable(path, exc) from None


def _tensor_table(path: Path):
    """``(tensors, data_start)`` of a GGUF file's tensor table (transformers' reader: a memory map, no tensor
    data read; the ``gguf`` package's where transformers' lacks a tensor type of the file, see
    :func:`quantizer_reads`); a clear error for a table that cannot be read."""
    from transformers.integrations.gguf import GgufHeader  # lazy: import cost (transformers 1.5 s)

    try:
        header = GgufHeader.from_file(str(path))
    except _UNREADABLE as exc:
        if quantizer_reads(path):  # not a type transformers lacks: the table itself is damaged
            raise _unreadable(path, exc) from None
        tensors = [SimpleNamespace(name=t.name, offset=int(t.data_offset), nbytes=int(t.n_bytes),
                                   shape=tuple(int(d) for d in t.shape)) for t in _gguf_reader(path).tensors]
        return tensors, 0  # the gguf package's offsets are from the start of the file
    return header.tensors, header.data_start


def check_sizes(path: Path, metadata: dict, allow_large: bool | None = None) -> None:
    """Refuse, before transformers builds or dequantises anything, a GGUF file whose metadata states a size
    past :data:`lens.model.files.SIZE_FIELDS`' limits, whose tensors lie past its end, or whose float32 weights
    (the larger of the tensor table's sum and the least its sizes imply) exceed the host's memory (dequantising
    runs on the CPU) unless ``allow_large``."""
    arch = metadata.get("general.architecture")
    sizes = {}
    for key, field in SIZE_KEYS.items():
        value = metadata.get(f"{arch}.{key}")
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v == 0 and key not in NEVER_ZERO and not isinstance(v, bool):
                continue  # llama.cpp's "unused"
            problem = size_problem(field, v) if not isinstance(v, float) else "expected an integer"
            if problem:
                raise LensInputError(f"{path}: GGUF metadata {arch}.{key} is {str(value)[:40]}: {problem} "
                                     f"(the rule for a config's {field})")
        if key in _BOUND_KEYS:
            sizes[_BOUND_KEYS[key]] = max(values, default=0)
    tokens = metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool):  # the reader counts a string array it skips
        problem = size_problem("vocab_size", tokens)
        if problem:
            raise LensInputError(f"{path}: GGUF metadata tokenizer.ggml.tokens holds {tokens} tokens: {problem}")
        sizes.setdefault("vocab_size", tokens)
    tensors, data_start = _tensor_table(path)
    size = path.stat().st_size
    for t in tensors:
        if data_start + t.offset + t.nbytes > size:
            raise LensInputError(f"{path} is not a readable GGUF file: tensor {t.name[:80]!r} lies at bytes "
                                 f"{data_start + t.offset}..{data_start + t.offset + t.nbytes}, past the end of "
                                 f"the file ({size} bytes): it is truncated or its tensor table is damaged")
    if memory_check_skipped(allow_large):
        return
    elements = sum(math.prod(t.shape) for t in tensors)
    bound = lower_bound_params(SimpleNamespace(**sizes))
    check_bytes(4 * max(elements, bound), None, f"GGUF file {path}", "at least ")


def read_architecture(path: Path, metadata: dict | None = None) -> tuple[str, str]:
    """``(general.architecture, general.name)`` of a GGUF file (from ``metadata`` when already read)."""
    metadata = read_metadata(path) if metadata is None else metadata
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise LensInputError(f"{path} names no architecture (general.architecture); GGUF files that load: "
                             f"{_supported_line()}")
    name = metadata.get("general.name")
    return arch, name if isinstance(name, str) else ""


def missed_config(arch: str, metadata: dict) -> dict:
    """The config fields of :data:`READER_MISSES` that the file states, as ``from_pretrained`` keywords."""
    out = {}
    for key, field in READER_MISSES.get(arch, {}).items():
        value = metadata.get(f"{arch}.{key}")
        if isinstance(value, int) and not isinstance(value, bool):
            out[field] = value
    return out


def model_type_of(arch: str, name: str = "") -> str:
    """The transformers model type a loadable file of ``arch`` becomes; a clear error for the rest."""
    if arch in REFUSED:
        raise LensInputError(f"GGUF architecture {arch!r} is not loaded by the workbench: {REFUSED[arch]}. "
                             f"GGUF architectures that load: {_supported_line()}")
    loads = architectures()
    if arch not in loads:
        raise LensInputError(f"GGUF architecture {arch!r} cannot be loaded: transformers has no GGUF reader for it. "
                             f"GGUF architectures that load: {_supported_line()}")
    if arch == "llama" and name == "mistral":  # transformers' reader: exactly this name reads as Mistral
        return "mistral"
    return loads[arch]


def _config_override(gguf: Path, model_type: str) -> dict:
    """``config=`` for the one file transformers reads under a name its tensor map lacks: a ``llama`` file
    named ``mistral`` reads as a Mistral config, and gguf has no ``mistral`` tensor table (llama.cpp
    writes Mistral as ``llama``). It loads as the Llama it is written as; the tensors are the same."""
    if model_type != "mistral":
        return {}
    from transformers import AutoConfig, LlamaConfig  # lazy: import cost (transformers 1.5 s)

    mistral = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name).to_dict()
    return {"config": LlamaConfig(**{k: v for k, v in mistral.items()
                                     if k not in ("model_type", "architectures", "transformers_version")})}


@contextlib.contextmanager
def _no_progress_bar():
    """transformers' legacy GGUF reader draws its own tqdm bar, outside its progress-bar switch."""
    try:
        import transformers.modeling_gguf_pytorch_utils as legacy  # lazy: import cost (transformers 1.5 s)
    except ImportError:  # pragma: no cover - a transformers without the legacy reader
        yield
        return
    bar = legacy.tqdm
    legacy.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        legacy.tqdm = bar


def dequantise(gguf: Path, target: Path, allow_large: bool | None = None) -> Path:
    """Dequantise ``gguf`` into an fp32 model folder at ``target`` (written atomically); return it. The file's
    sizes are checked first (:func:`check_sizes`; ``allow_large`` skips the memory part)."""
    metadata = read_metadata(gguf)
    arch, name = read_architecture(gguf, metadata)
    model_type = model_type_of(arch, name)
    check_sizes(gguf, metadata, allow_large)  # before transformers' model classes are even imported
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig  # lazy: import cost (transformers 1.5 s)

    config_kwargs = _config_override(gguf, model_type) or missed_config(arch, metadata)
    log.info("dequantising %s (%s, loads as %s) once into %s", gguf, arch, model_type, target)
    try:
        with _no_progress_bar():
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            # dequantize=True: plain dense weights even where transformers could keep blocks packed;
            # mismatched shapes are reported in `info` (refused below, naming them) rather than raised
            # a file with a tensor type transformers' quantizer lacks goes through its plain gguf_file= load
            # (the gguf package's dequantiser), which unpacks every weight to dense fp32 too
            quantizer = {"quantization_config": GgufConfig(dequantize=True)} if quantizer_reads(gguf) else {}
            quant, info = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, output_loading_info=True,
                ignore_mismatched_sizes=True, **quantizer, **config_kwargs)
    except (ValueError, KeyError, TypeError, NotImplementedError, RuntimeError, OSError) as exc:
        raise LensInputError(
            f"transformers could not load the {arch} GGUF file {gguf} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise LensInputError(
            f"{gguf}: transformers loaded this {arch} GGUF file without {len(missing)} of the model's weights "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); they would stay random, so it is refused")
    mismatched = sorted(info.get("mismatched_keys") or ())
    if mismatched:
        key, in_file, in_model = mismatched[0]
        raise LensInputError(
            f"{gguf}: {len(mismatched)} tensors of this {arch} GGUF file do not fit the model transformers configured "
            f"from its metadata (e.g. {key}: {tuple(in_file)} in the file, {tuple(in_model)} in the model), likely a "
            f"size stated under a key transformers' GGUF reader does not read; they would stay random, so it is refused")
    config = quant.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the cached copy is plain fp32 and reloads without gguf
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quant.state_dict())
    del quant
    with atomic_dir(target) as tmp:  # another process that filled it first wins: its copy is used
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "SOURCE").write_text(f"{gguf}\n{arch}\n")
    return target
