"""How matrix products are computed: float32, or bfloat16 where the device multiplies it natively.

CUDA GPUs multiply bfloat16 natively, and so do CPUs with AMX tiles or AVX512-BF16 (measured on this
project's 2-core Xeon: the block-shaped products of SmolLM2 3.5–4× faster in bfloat16 than in float32,
the 49k-wide unembedding about 2×, side by side). Where a computation may trade float32 rounding for
that speed, it asks here, once, instead of reading CPU flags itself: the candidate search of the
exact kNN (certified afterwards), the training steps of the tuned lens (evaluated in float32
afterwards), and the forward passes a study runs itself to measure behaviour under an intervention
(layer ablation, filler removal, steering), through :func:`matmul_precision`.

``precision`` values, one vocabulary for every caller (:data:`PRECISIONS`): ``"float32"``;
``"bfloat16"``; ``"auto"`` = bfloat16 where :func:`native_bfloat16`, else float32.

:func:`matmul_precision` ("bfloat16" on a CPU) sets oneDNN's float32 math mode to bf16 for the
enclosed code (``torch.backends.mkldnn.matmul.fp32_precision``, PyTorch's own switch behind
``torch.set_float32_matmul_precision("medium")``): tensors stay float32 and every other operation —
norms, softmax, residual sums — stays float32; only the inputs of the matrix products are rounded to
bfloat16, products accumulate and come out in float32. Measured on SmolLM2-135M (16 × 128 tokens of
wiki-sample, one thread): the forward 2.0–2.2× faster, the top-1 token unchanged on 98.9% of
positions, mean cross-entropy 3.3655 vs 3.3641 nats (per token |Δ| 0.015), accuracy 0.3701 vs
0.3706. Stored activations are never computed this way: a capture runs the model in its own dtype —
float32 arithmetic unless it was loaded in bfloat16 or float16 (``--model-dtype``, which the store's
settings record as ``model_dtype``).
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager

import torch

from lens.errors import LensInputError

__all__ = ["PRECISIONS", "native_bfloat16", "resolve_precision", "matmul_precision", "describe_precision"]

PRECISIONS = ("auto", "float32", "bfloat16")
_lock = threading.Lock()
# the open blocks' modes, innermost last, and the mode before the outermost one (the switch is
# process-wide: blocks on several threads share it, the last one entered decides)
_stack: list = []
_base = [None]


def native_bfloat16(device: torch.device | str = "cpu") -> bool:
    """True on CUDA and on CPUs with AMX or AVX512-BF16; False elsewhere (and where torch cannot tell)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return True
    return dev.type == "cpu" and _cpu_bfloat16()


@functools.cache
def _cpu_bfloat16() -> bool:
    cpu = getattr(torch, "cpu", None)
    amx = getattr(cpu, "_is_amx_tile_supported", lambda: False)
    bf16 = getattr(cpu, "_is_avx512_bf16_supported", lambda: False)
    try:
        return bool(amx() or bf16())
    except Exception:  # an older torch or an unknown CPU: assume not
        return False


def resolve_precision(precision: str, device: torch.device | str = "cpu") -> str:
    """``"float32"`` or ``"bfloat16"`` for ``precision`` (one of :data:`PRECISIONS`) on ``device``."""
    if precision not in PRECISIONS:
        raise LensInputError(f"precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "auto":
        return "bfloat16" if native_bfloat16(device) else "float32"
    return precision


def _onednn_switch():
    mkldnn = getattr(torch.backends, "mkldnn", None)
    matmul = getattr(mkldnn, "matmul", None)
    return matmul if matmul is not None and hasattr(matmul, "fp32_precision") else None


@contextmanager
def matmul_precision(precision: str, device: torch.device | str = "cpu"):
    """Inside the block, float32 matrix products on ``device`` use ``precision`` (module docstring);
    yields the resolved precision ("float32" or "bfloat16"). Only CPUs have a float32-in,
    float32-out bfloat16 mode; on another device "auto" resolves to float32 and "bfloat16" is
    refused (load the model in bfloat16 there: ``--model-dtype bfloat16``). Blocks nest: the innermost
    one decides (a "float32" block inside a "bfloat16" one computes in float32, e.g. to check a
    shortcut exactly), and the mode before the outermost block is restored when it ends, even
    after an exception."""
    dev = torch.device(device)
    resolved = resolve_precision(precision, dev) if dev.type == "cpu" or precision != "auto" else "float32"
    switch = _onednn_switch()
    if resolved == "bfloat16" and (dev.type != "cpu" or switch is None):
        raise LensInputError(f"precision='bfloat16' for float32 weights needs a CPU with oneDNN's bf16 math "
                             f"mode (torch.backends.mkldnn.matmul.fp32_precision); got device {dev}")
    if switch is None or dev.type != "cpu" or (resolved == "float32" and not _stack):
        yield resolved  # nothing to change: float32 is the mode outside every block
        return
    entry = object()
    with _lock:
        if not _stack:
            _base[0] = switch.fp32_precision
        _stack.append((entry, "bf16" if resolved == "bfloat16" else _base[0]))
        switch.fp32_precision = _stack[-1][1]
    try:
        yield resolved
    finally:
        with _lock:
            _stack[:] = [e for e in _stack if e[0] is not entry]
            switch.fp32_precision = _stack[-1][1] if _stack else _base[0]


def describe_precision(resolved: str, model_dtype=None) -> str:
    """The words a result records for a resolved precision; for a model loaded in another dtype than
    float32 (``model_dtype``, e.g. ``--model-dtype bfloat16``), that dtype is what ran."""
    name = str(model_dtype).replace("torch.", "") if model_dtype is not None else "float32"
    if name != "float32":
        return f"{name} model: {name} weights and forward pass (the precision setting applies to float32 models)"
    return ("bfloat16 matrix products, float32 accumulation and everything else float32"
            if resolved == "bfloat16" else "float32")
