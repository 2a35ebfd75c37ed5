"""A model folder checked before transformers touches it, and the memory a model would take.

:func:`check_model_dir` reads what a folder says about itself — ``config.json``, the safetensors headers,
the tokenizer's JSON files — and refuses, with one :class:`~lens.errors.LensInputError` naming the file and
what is wrong, anything transformers would otherwise meet as a crash or an endless build: pickled weights
(``pytorch_model.bin`` is never unpickled), safetensors headers that lie (too large, offsets past the end,
overlapping or leaving holes, shapes that do not match their bytes, invalid UTF-8), JSON that is not an
object or is nested past reading, config sizes that are not positive integers or are absurd.

:func:`check_memory` estimates the parameters a config builds — first a lower bound by arithmetic
(embedding + one d×d matrix per layer: a 10⁷-layer config is refused at once), then the exact count from
the model built on the meta device (no memory) — and refuses a model whose float32 weights exceed the
memory available (host memory, or the GPU's free memory), unless ``allow_large`` (CLI
``--no-memory-check``, environment ``LENS_NO_MEMORY_CHECK=1``).
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from pathlib import Path

from lens.errors import LensInputError
import torch
from lens.runtime.devices import available_bytes

MAX_JSON_BYTES = 64 << 20  # config / tokenizer JSON files larger than this are not model files
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on a header
MAX_LAYERS = 4096  # deeper than any published model by 30x
MAX_WIDTH = 1 << 24  # hidden / intermediate sizes
MAX_VOCAB = 1 << 24
PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
NO_CHECK_ENV = "LENS_NO_MEMORY_CHECK"

# config fields that size a model: each, where present and not null, must be a positive integer under its limit
SIZE_FIELDS = {
    "num_hidden_layers": MAX_LAYERS, "n_layer": MAX_LAYERS, "num_layers": MAX_LAYERS, "n_layers": MAX_LAYERS,
    "decoder_layers": MAX_LAYERS, "hidden_size": MAX_WIDTH, "n_embd": MAX_WIDTH, "d_model": MAX_WIDTH,
    "intermediate_size": MAX_WIDTH, "n_inner": MAX_WIDTH, "ffn_dim": MAX_WIDTH, "vocab_size": MAX_VOCAB,
    "num_attention_heads": MAX_WIDTH, "n_head": MAX_WIDTH, "num_key_value_heads": MAX_WIDTH,
    "head_dim": MAX_WIDTH, "max_position_embeddings": 1 << 26, "n_positions": 1 << 26,
    "num_local_experts": 1 << 16, "num_experts": 1 << 16, "num_experts_per_tok": 1 << 16,
}
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
                "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


def _regular(path: Path, what: str) -> os.stat_result:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise LensInputError(f"{what} {str(path)[:200]} cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise LensInputError(f"{what} {path} is not a regular file: expected the file transformers writes")
    return st


def read_json_file(path: Path, what: str) -> object:
    """A JSON file of a model folder, refused in one line when it is not one (too large, not UTF-8, not
    JSON, nested past reading)."""
    st = _regular(path, what)
    if st.st_size > MAX_JSON_BYTES:
        raise LensInputError(f"{what} {path} is {st.st_size} bytes: expected at most {MAX_JSON_BYTES}")
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read().decode("utf-8"))
    except OSError as exc:
        raise LensInputError(f"{what} {path} cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise LensInputError(f"{what} {path} is not UTF-8 (byte {exc.start} is invalid)") from None
    except json.JSONDecodeError as exc:
        raise LensInputError(f"{what} {path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise LensInputError(f"{what} {path} is nested too deeply to read: expected the JSON transformers "
                             "writes") from None


def size_problem(name: str, value: object) -> str | None:
    """What is wrong with ``value`` for the size field ``name`` of :data:`SIZE_FIELDS` (``None``: nothing) —
    the one rule for model folders, hub configs and GGUF metadata alike."""
    limit = SIZE_FIELDS[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        return f"expected a positive integer of at most {limit}"
    return None


def check_config_values(config: dict, path: Path) -> None:
    """Every size field a positive integer under its limit (in the config and its text_config)."""
    for scope, cfg in (("", config), ("text_config.", config.get("text_config"))):
        if not isinstance(cfg, dict):
            continue
        for name in SIZE_FIELDS:
            value = cfg.get(name)
            if value is None:
                continue
            problem = size_problem(name, value)
            if problem:
                raise LensInputError(f"{path}: {scope}{name} is {str(value)[:40]}: {problem}")


def check_safetensors(path: Path) -> None:
    """The header of a safetensors file, as safetensors itself will read it: a UTF-8 JSON object under
    100 MB whose tensors tile the data after it exactly, each with as many bytes as its shape and dtype need."""
    size = _regular(path, "weights file").st_size
    bad = f"weights file {path} is not a valid safetensors file"
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise LensInputError(f"{bad}: {size} bytes, shorter than its 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise LensInputError(f"{bad}: its header claims {n} bytes, the file has {size - 8} after the length")
            raw = fh.read(n)
    except OSError as exc:
        raise LensInputError(f"weights file {path} cannot be read ({exc.strerror or exc})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise LensInputError(f"{bad}: its header is not UTF-8 (byte {8 + exc.start})") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise LensInputError(f"{bad}: its header is not a JSON object "
                             f"({getattr(exc, 'msg', 'nested too deeply')})") from None
    if not isinstance(header, dict):
        raise LensInputError(f"{bad}: its header is not a JSON object")
    data = size - 8 - n
    spans = []
    for name, t in header.items():
        if name == "__metadata__":
            if not isinstance(t, dict) or not all(isinstance(v, str) for v in t.values()):
                raise LensInputError(f"{bad}: __metadata__ is not a map of strings")
            continue
        if not isinstance(t, dict) or t.get("dtype") not in _DTYPE_BYTES:
            raise LensInputError(f"{bad}: tensor {name[:80]!r} has no known dtype")
        shape, offs = t.get("shape"), t.get("data_offsets")
        if (not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 1 << 62 for d in shape)
                or not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs)):
            raise LensInputError(f"{bad}: tensor {name[:80]!r} needs a shape of sizes and two data offsets")
        begin, end = offs
        if not 0 <= begin <= end <= data:
            raise LensInputError(f"{bad}: tensor {name[:80]!r} lies at bytes {begin}..{end}, past the "
                                 f"{data} bytes of data")
        need = math.prod(shape) * _DTYPE_BYTES[t["dtype"]]
        if need != end - begin:
            raise LensInputError(f"{bad}: tensor {name[:80]!r} of shape {shape} needs {need} bytes, its offsets "
                                 f"give {end - begin}")
        spans.append((begin, end, name))
    spans.sort()
    at = 0
    for begin, end, name in spans:
        if begin != at:
            raise LensInputError(f"{bad}: tensor {name[:80]!r} starts at byte {begin}, expected {at} "
                                 "(tensors overlap or leave a hole)")
        at = end
    if at != data:
        raise LensInputError(f"{bad}: its tensors cover {at} of the {data} bytes of data")


def check_model_dir(path: Path) -> dict:
    """Refuse a model folder that would crash or run away inside transformers; return its config."""
    config = read_json_file(path / "config.json", "model config")
    if not isinstance(config, dict):
        raise LensInputError(f"model config {path / 'config.json'} is not a JSON object: expected the config "
                             "transformers writes")
    check_config_values(config, path / "config.json")
    try:
        names = sorted(p.name for p in path.iterdir())
    except OSError as exc:
        raise LensInputError(f"model folder {path} cannot be listed ({exc.strerror or exc})") from None
    tensors = [n for n in names if n.endswith(".safetensors")]
    pickled = [n for n in names if n.endswith(PICKLED)]
    if not tensors and pickled:
        raise LensInputError(f"{path / pickled[0]} holds pickled weights, which the workbench never loads (a "
                             "pickle can run code): expected model.safetensors (convert with safetensors' "
                             "convert script, or save_pretrained(safe_serialization=True))")
    for name in tensors:
        check_safetensors(path / name)
    index = path / "model.safetensors.index.json"
    if index.exists():
        idx = read_json_file(index, "weights index")
        files = idx.get("weight_map", {}).values() if isinstance(idx, dict) else None
        if not isinstance(idx, dict) or not isinstance(idx.get("weight_map"), dict) or not all(
                isinstance(f, str) and f in tensors for f in files):
            raise LensInputError(f"weights index {index} must map each tensor to a .safetensors file of the "
                                 "folder")
    for name, must in (("tokenizer.json", "model"), ("tokenizer_config.json", None)):
        if name in names:
            tok = read_json_file(path / name, "tokenizer file")
            if not isinstance(tok, dict) or (must is not None and not isinstance(tok.get(must), dict)):
                raise LensInputError(f"tokenizer file {path / name} is not a tokenizer: expected a JSON object"
                                     + (f" with a '{must}' object" if must else ""))
    return config


# --------------------------------------------------------------------------- memory
def memory_check_skipped(allow_large: bool | None) -> bool:
    if allow_large is not None:
        return bool(allow_large)
    return os.environ.get(NO_CHECK_ENV, "").lower() in ("1", "true", "yes")


def _first(cfg, *names, default=None):
    for n in names:
        v = getattr(cfg, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return default


def lower_bound_params(config) -> int:
    """Parameters every such model has at least: its embedding and one d x d map per layer."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    d = _first(cfg, "hidden_size", "n_embd", "d_model", default=1)
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers", default=1)
    vocab = _first(cfg, "vocab_size", default=1)
    return vocab * d + layers * d * d


def meta_params(cls, config) -> int:
    """The exact parameter count: the model built on the meta device (no memory is allocated)."""
    try:
        with torch.device("meta"):
            model = cls.from_config(config)
    except (RecursionError, MemoryError):
        raise LensInputError(f"the config of {getattr(config, 'model_type', 'this model')} cannot build a "
                             "model: its sizes are past what can be built") from None
    except Exception as exc:  # transformers' own checks of a config: bad input, one line
        raise LensInputError(f"the config cannot build a {getattr(config, 'model_type', '')} model "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
    return sum(p.numel() for p in model.parameters())


def check_memory(cls, config, device, source: str, allow_large: bool | None = None, dtype=None) -> None:
    """Refuse a model whose weights, in the dtype it is loaded in (``dtype``: a torch dtype or its name;
    None = float32), would not fit where it is loaded (before it is built)."""
    if memory_check_skipped(allow_large):
        return

    name = str(dtype).replace("torch.", "") if dtype is not None else "float32"
    itemsize = getattr(torch, name).itemsize if isinstance(getattr(torch, name, None), torch.dtype) else 4
    check_bytes(lower_bound_params(config) * itemsize, device, source, "at least ", name)

    have, where = available_bytes(device)
    need = meta_params(cls, config) * itemsize
    if need > have:
        raise _too_large(source, need, have, where, "", name)


def check_bytes(need: int, device, source: str, qual: str = "", dtype: str = "float32") -> None:
    """Refuse ``need`` bytes of ``dtype`` weights past the memory available on ``device``."""
    have, where = available_bytes(device)
    if need > have:
        raise _too_large(source, need, have, where, qual, dtype)


def _too_large(source: str, need: int, have: int, where: str, qual: str, dtype: str = "float32") -> LensInputError:
    return LensInputError(f"{source} needs {qual}{need / 2**30:.1f} GiB for its {dtype} weights, "
                          f"{have / 2**30:.1f} GiB {where}: expected a model that fits (pass --no-memory-check, "
                          "or allow_large=True, to load it anyway; --device-map splits one across devices)")
