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
import os
import shutil
import struct
import tempfile
from pathlib import Path

import torch

from lens.errors import LensInputError

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
    from transformers.integrations import GGUF_CONFIG_MAPPING
    from transformers.integrations.gguf import GGUF_CONFIG_ARCHS

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
    from transformers.integrations.gguf import read_gguf_metadata

    check_magic(path)
    try:
        metadata, _ = read_gguf_metadata(str(path))
    except (ValueError, struct.error, UnicodeDecodeError, IndexError, OverflowError, MemoryError) as exc:
        raise LensInputError(f"{path} is not a readable GGUF file: its header is damaged or truncated "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
    return metadata


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
    from transformers import AutoConfig, LlamaConfig

    mistral = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name).to_dict()
    return {"config": LlamaConfig(**{k: v for k, v in mistral.items()
                                     if k not in ("model_type", "architectures", "transformers_version")})}


@contextlib.contextmanager
def _no_progress_bar():
    """transformers' legacy GGUF reader draws its own tqdm bar, outside its progress-bar switch."""
    try:
        import transformers.modeling_gguf_pytorch_utils as legacy
    except ImportError:  # pragma: no cover - a transformers without the legacy reader
        yield
        return
    bar = legacy.tqdm
    legacy.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        legacy.tqdm = bar


def dequantise(gguf: Path, target: Path) -> Path:
    """Dequantise ``gguf`` into an fp32 model folder at ``target`` (written atomically); return it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    metadata = read_metadata(gguf)
    arch, name = read_architecture(gguf, metadata)
    model_type = model_type_of(arch, name)
    config_kwargs = _config_override(gguf, model_type) or missed_config(arch, metadata)
    log.info("dequantising %s (%s, loads as %s) once into %s", gguf, arch, model_type, target)
    try:
        with _no_progress_bar():
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            # dequantize=True: plain dense weights even where transformers could keep blocks packed;
            # mismatched shapes are reported in `info` (refused below, naming them) rather than raised
            quant, info = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, output_loading_info=True,
                ignore_mismatched_sizes=True, quantization_config=GgufConfig(dequantize=True), **config_kwargs)
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
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "SOURCE").write_text(f"{gguf}\n{arch}\n")
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race; use its copy
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
