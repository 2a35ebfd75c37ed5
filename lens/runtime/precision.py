"""How matrix products are computed: float32, or bfloat16 where the device multiplies it natively.

CUDA GPUs multiply bfloat16 natively, and so do CPUs with AMX tiles or AVX512-BF16 (measured on this
project's 2-core Xeon: the block-shaped products of SmolLM2 3.5–4× faster in bfloat16 than in float32,
the 49k-wide unembedding about 2×, side by side; on an AMD EPYC without AVX512 bfloat16 is emulated and
a product is ~60× slower). Where a computation may trade float32 rounding for that speed, it asks here,
once, instead of reading CPU flags itself: the candidate search of the exact kNN (certified
afterwards), the training steps of the tuned lens (evaluated in float32 afterwards), and the forward
passes a study runs itself to measure behaviour under an intervention (layer ablation, filler removal,
steering), through :func:`matmul_precision` (:func:`forward_precision` around a model's forwards: the same,
with each linear layer's bfloat16 weight cast once per block instead of once per call).

``precision`` values, one vocabulary for every caller (:data:`PRECISIONS`): ``"float32"``;
``"bfloat16"``; ``"auto"`` = bfloat16 where :func:`native_bfloat16`, else float32.

Every decision is taken from behaviour measured once per process, never from a CPU flag:
:func:`native_bfloat16` times a bfloat16 product beside a float32 one (:func:`cpu_bfloat16_speedup`),
and :func:`onednn_bf16_mode_engages` checks that oneDNN's bf16 math mode really rounds a product's
inputs. Two paths compute "bfloat16" (:func:`bfloat16_path`), and :func:`matmul_precision` yields
which one ran, for the result to record (:func:`describe_precision`):

- ``"bfloat16"``: oneDNN's float32 math mode set to bf16 for the enclosed code
  (``torch.backends.mkldnn.matmul.fp32_precision``, PyTorch's own switch behind
  ``torch.set_float32_matmul_precision("medium")``): tensors stay float32 and every other operation —
  norms, softmax, residual sums — stays float32; only the inputs of the matrix products are rounded to
  bfloat16, products accumulate and come out in float32. Measured on SmolLM2-135M (16 × 128 tokens of
  wiki-sample, one thread, Intel Xeon with AMX): the forward 2.0–2.2× faster, the top-1 token unchanged
  on 98.9% of positions, mean cross-entropy 3.3655 vs 3.3641 nats (per token |Δ| 0.015).
- ``"bfloat16-autocast"``, where that mode does not engage (seen on an AMD EPYC with AVX512-BF16: the
  switch is accepted and products stay float32) or on CUDA: ``torch.autocast(dtype=bfloat16)`` —
  linear layers and matmuls take and give bfloat16 (float32 accumulation inside the kernel), norms,
  softmax and the residual sums stay float32.

Stored activations are never computed this way: a capture runs the model in its own dtype — float32
arithmetic unless it was loaded in bfloat16 or float16 (``--model-dtype``, which the store's settings
record as ``model_dtype``).
"""

from __future__ import annotations

import functools
import threading
import time
from contextlib import ExitStack, contextmanager

import torch

from lens.errors import LensInputError
from lens.runtime.devices import available_bytes
from lens.runtime.threads import serial

__all__ = ["PRECISIONS", "native_bfloat16", "cpu_bfloat16_speedup", "onednn_bf16_mode_engages", "bfloat16_path",
           "resolve_precision", "matmul_precision", "forward_precision", "describe_precision"]

PRECISIONS = ("auto", "float32", "bfloat16")
_lock = threading.Lock()
# the open blocks' modes, innermost last, and the mode before the outermost one (the switch is
# process-wide: blocks on several threads share it, the last one entered decides)
_stack: list = []
_base = [None]


def native_bfloat16(device: torch.device | str = "cpu") -> bool:
    """True where bfloat16 matrix products are faster than float32 ones: on CUDA, and on a CPU where a
    block-shaped bfloat16 product, timed once per process beside the same float32 product, runs at
    least :data:`FAST_RATIO` times faster (AMX or AVX512-BF16 kernels: 2-4x; elsewhere bfloat16 is
    emulated and tens of times slower, so the two cases are far apart). A CPU flag is not enough:
    whether a kernel uses it depends on the torch build and the shapes, so the behaviour is measured."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return True
    return dev.type == "cpu" and cpu_bfloat16_speedup() >= FAST_RATIO


FAST_RATIO = 1.25


#: rounds of the interleaved timing (each: one float32 product, one bfloat16 product)
SPEEDUP_ROUNDS = 15
#: bfloat16 this many times slower than float32 is emulated: the timing stops (native kernels are faster, emulated
#: ones tens of times slower, so anything between reads the same either side of it)
EMULATED_RATIO = 8.0


@functools.cache
def cpu_bfloat16_speedup() -> float:
    """float32 time / bfloat16 time of a (128 x 576) @ (576 x 768) product on this CPU, at the process's thread
    count; measured once per process.

    Timed on one thread (:func:`lens.runtime.threads.serial`): whether the kernel is native does not depend on
    the thread count, while at two threads on a busy machine a product's time is the threads' barrier (measured:
    0.5 ms on one thread, 3-5 ms on two beside another busy process, for either dtype, the ratio ~1 either way).
    The two products are timed in turns (:data:`SPEEDUP_ROUNDS` rounds after a warm-up) and the fastest run of
    each is compared, so that a busy machine — a run descheduled by another process — slows both alike and the
    decision does not flip from one process to the next (it did when all float32 runs came first and one slow
    bfloat16 run ended the timing: the same study then trained in bfloat16 in one run and float32 in the next).
    Emulated bfloat16 is tens of times slower: the timing stops once bfloat16's fastest run is
    :data:`EMULATED_RATIO` times float32's after three rounds."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(128, 576, generator=gen), torch.randn(576, 768, generator=gen)
    a16, b16 = a.bfloat16(), b.bfloat16()

    def timed(x, y) -> float:
        start = time.perf_counter()
        torch.matmul(x, y)
        return time.perf_counter() - start

    try:
        with serial(), _float32_outside_blocks():
            torch.matmul(a, b), torch.matmul(a16, b16)
            f32 = bf16 = float("inf")
            for round_ in range(SPEEDUP_ROUNDS):
                f32 = min(f32, timed(a, b))
                bf16 = min(bf16, timed(a16, b16))
                if round_ >= 2 and bf16 > EMULATED_RATIO * f32:
                    break
            return f32 / bf16
    except RuntimeError:  # a build without bfloat16 matmul on the CPU
        return 0.0


@functools.cache
def onednn_bf16_mode_engages() -> bool:
    """Whether oneDNN's float32 math mode "bf16" really rounds a float32 product's inputs here: a
    product computed inside the mode must differ from float32's answer and match the exact product of
    the bfloat16-rounded inputs. On some CPUs with AVX512-BF16 (seen on AMD EPYC) the switch is
    accepted and nothing changes; then the bfloat16 path is autocast (:func:`bfloat16_path`)."""
    switch = _onednn_switch()
    if switch is None:
        return False
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 256, generator=gen), torch.randn(256, 96, generator=gen)
    with _lock:
        before = switch.fp32_precision
        try:
            switch.fp32_precision = "bf16"
            y = (a @ b).double()
            lin = torch.nn.functional.linear(a, b.T.contiguous()).double()
        except RuntimeError:
            return False
        finally:
            switch.fp32_precision = before
    exact = a.double() @ b.double()
    rounded = a.bfloat16().double() @ b.bfloat16().double()
    scale = float((a.abs().double() @ b.abs().double()).max())
    # float32 alone errs by ~1e-6 * scale; bfloat16 inputs by ~1e-3 * scale (8 significant bits)
    return all(float((z - exact).abs().max()) > 1e-4 * scale and float((z - rounded).abs().max()) < 1e-5 * scale
               for z in (y, lin))


def bfloat16_path(device: torch.device | str = "cpu") -> str:
    """How ``precision="bfloat16"`` computes on ``device``: ``"onednn"`` (float32 tensors, oneDNN's bf16
    math mode rounds only the products' inputs) where that mode engages, else ``"autocast"``
    (``torch.autocast(dtype=bfloat16)``: the inputs and outputs of linear layers and matmuls are
    bfloat16, accumulation float32; norms, softmax and residual sums stay float32)."""
    dev = torch.device(device)
    return "onednn" if dev.type == "cpu" and onednn_bf16_mode_engages() else "autocast"


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
def _float32_outside_blocks():
    """float32 products for a measurement, whatever block the caller is in."""
    with matmul_precision("float32"), torch.autocast("cpu", enabled=False):
        yield


@contextmanager
def matmul_precision(precision: str, device: torch.device | str = "cpu"):
    """Inside the block, float32 matrix products on ``device`` use ``precision`` (module docstring);
    yields what runs: ``"float32"``, ``"bfloat16"`` (oneDNN's bf16 math mode: float32 tensors, only the
    products' inputs rounded) or ``"bfloat16-autocast"`` (:func:`bfloat16_path`). "auto" is bfloat16
    where :func:`native_bfloat16`, else float32. On a CUDA device "bfloat16" is autocast; on another
    device "auto" is float32. Blocks nest: the innermost one decides (a "float32" block inside a
    "bfloat16" one computes in float32, e.g. to check a shortcut exactly), and the mode before the
    outermost block is restored when it ends, even after an exception. A model loaded in bfloat16 or
    float16 (``--model-dtype``) computes in its own dtype whatever the block says."""
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        if precision == "bfloat16":
            raise LensInputError(f"precision='bfloat16' needs a CPU or a CUDA device; got device {dev}")
        resolve_precision(precision, "cpu")  # validates the word
        yield "float32"
        return
    resolved = resolve_precision(precision, dev)
    path = bfloat16_path(dev) if resolved == "bfloat16" else None
    switch = _onednn_switch() if dev.type == "cpu" else None
    with ExitStack() as stack:
        if resolved == "float32" and torch.is_autocast_enabled(dev.type):
            stack.enter_context(torch.autocast(dev.type, enabled=False))  # a float32 block inside autocast
        elif path == "autocast":
            stack.enter_context(torch.autocast(dev.type, dtype=torch.bfloat16))
        if switch is None or (resolved == "float32" and not _stack):
            yield "bfloat16-autocast" if path == "autocast" else resolved
            return
        entry = object()
        mode = "bf16" if path == "onednn" else None
        with _lock:
            if not _stack:
                _base[0] = switch.fp32_precision
            _stack.append((entry, mode or _base[0]))
            switch.fp32_precision = _stack[-1][1]
        try:
            yield "bfloat16-autocast" if path == "autocast" else resolved
        finally:
            with _lock:
                _stack[:] = [e for e in _stack if e[0] is not entry]
                switch.fp32_precision = _stack[-1][1] if _stack else _base[0]


@contextmanager
def forward_precision(precision: str, model):
    """:func:`matmul_precision` for a block that runs ``model`` itself many times (an intervention study's
    forward passes); yields the same words. Under autocast every plain ``nn.Linear`` of the model computes
    with a bfloat16 copy of its weight and bias made once for the block, instead of autocast casting them
    on every call (autocast keeps no cast of a frozen weight, and none at all under
    ``torch.inference_mode``), which on a CPU costs more than a small forward's products (SmolLM2, one
    thread, AVX512-BF16 EPYC: a 1-token forward 122 ms under autocast against 73 ms in float32, 65 ms with
    the copies). The copies are the values autocast would have cast, so every result is bit for bit the
    same. The parameters themselves never change: a call with autocast off (a float32 block nested inside,
    e.g. a check of a shortcut) uses the float32 weights, and code that reads a weight reads float32.
    Only plain ``nn.Linear`` modules (a subclass's forward may use its weight otherwise), and only when the
    copies take less than half the memory available."""
    with matmul_precision(precision, model.device) as ran:
        linears = []
        if ran == "bfloat16-autocast":
            found = [m for m in model.hf_model.modules()
                     if type(m) is torch.nn.Linear and m.weight.dtype == torch.float32 and "forward" not in vars(m)]
            size = sum(m.weight.numel() + (0 if m.bias is None else m.bias.numel()) for m in found) * 2
            if size < available_bytes(model.device)[0] / 2:
                linears = found
        device_type = torch.device(model.device).type
        try:
            for m in linears:
                m.forward = _bfloat16_linear(m, device_type)
            yield ran
        finally:
            for m in linears:
                vars(m).pop("forward", None)


def _bfloat16_linear(module: torch.nn.Linear, device_type: str):
    """``module``'s forward with its bfloat16 copies under autocast, its own weights otherwise."""
    weight = module.weight.detach().to(torch.bfloat16)
    bias = None if module.bias is None else module.bias.detach().to(torch.bfloat16)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(device_type):
            return torch.nn.functional.linear(x, weight, bias)
        return torch.nn.functional.linear(x, module.weight, module.bias)

    return forward


def describe_precision(ran: str, model_dtype=None) -> str:
    """The words a result records for what :func:`matmul_precision` yielded (what really ran); for a
    model loaded in another dtype than float32 (``model_dtype``, e.g. ``--model-dtype bfloat16``), that
    dtype is what ran."""
    name = str(model_dtype).replace("torch.", "") if model_dtype is not None else "float32"
    if name != "float32":
        return f"{name} model: {name} weights and forward pass (the precision setting applies to float32 models)"
    if ran == "bfloat16":
        return "bfloat16 matrix products (oneDNN bf16 math mode), float32 accumulation and everything else float32"
    if ran == "bfloat16-autocast":
        return ("bfloat16 matrix products under autocast (linear and matmul inputs and outputs bfloat16, "
                "float32 accumulation; norms, softmax and residual sums float32)")
    if ran == "float32":
        return "float32"
    raise ValueError(f"describe_precision: expected float32, bfloat16 or bfloat16-autocast; got {ran!r}")
