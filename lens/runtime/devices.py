"""Device names checked before anything is moved: a clear error instead of torch's assertion.

``torch.device("cuda")`` is accepted by a CPU-only torch build and fails later with an
``AssertionError`` ("Torch not compiled with CUDA enabled"); a misspelt device fails with a
``RuntimeError`` listing every backend torch knows. Both are bad input, said in one line here.
"""

from __future__ import annotations

import psutil
import torch

from lens.errors import LensInputError

EXPECTED = "cpu, cuda, cuda:N or mps"


def parse_device(device) -> str:
    """``device`` as a string torch accepts, refused (``LensInputError``) unless it exists here."""
    text = str(device).strip()
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise LensInputError(f"unknown device {text!r}: expected {EXPECTED}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is a CPU-only build" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise LensInputError(f"device {text!r} was requested but {why}: expected cpu here")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise LensInputError(f"device {text!r} does not exist: expected cuda:0..cuda:{torch.cuda.device_count() - 1}")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise LensInputError(f"device {text!r} was requested but MPS is not available: expected cpu here")
    elif dev.type not in ("cpu", "meta"):
        raise LensInputError(f"device {text!r} is not supported: expected {EXPECTED}")
    return text


def available_bytes(device) -> tuple[int, str]:
    """Memory a model (or a copy of its weights) may take on ``device``: the GPU's free memory, else the
    host's available memory; with the words that say which."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(dev)
        return int(free), f"free on {dev}"
    return int(psutil.virtual_memory().available), "of host memory available"
