"""lens.runtime.precision: one vocabulary for precision settings, and the bfloat16 matmul mode's contract —
float32 tensors in and out, only the products' inputs rounded, the previous mode restored."""

from __future__ import annotations

import pytest
import torch

from lens.errors import LensInputError
from lens.runtime.precision import (FAST_RATIO, PRECISIONS, bfloat16_path, cpu_bfloat16_speedup, describe_precision,
                            matmul_precision, native_bfloat16, onednn_bf16_mode_engages, resolve_precision)


def _switch():
    return torch.backends.mkldnn.matmul.fp32_precision


def test_resolve():
    assert PRECISIONS == ("auto", "float32", "bfloat16")
    assert resolve_precision("float32") == "float32"
    assert resolve_precision("bfloat16") == "bfloat16"
    assert resolve_precision("auto") == ("bfloat16" if native_bfloat16("cpu") else "float32")
    with pytest.raises(LensInputError, match="expected one of auto, float32, bfloat16, got 'fp16'"):
        resolve_precision("fp16")
    assert describe_precision("float32") == "float32"
    assert "bfloat16" in describe_precision("bfloat16")


def test_float32_changes_nothing():
    before = _switch()
    a, b = torch.randn(64, 96, dtype=torch.float64).float(), torch.randn(96, 80).float()
    with matmul_precision("float32") as p:
        assert p == "float32" and _switch() == before
        inside = a @ b
    assert torch.equal(inside, a @ b)


def _rounded_case(m=256, k=576, n=300):
    torch.manual_seed(0)
    a, b = torch.randn(m, k), torch.randn(k, n)
    exact = a.double() @ b.double()
    rounded = a.bfloat16().double() @ b.bfloat16().double()  # the products of the rounded inputs, exactly
    scale = float((a.bfloat16().double().abs() @ b.bfloat16().double().abs()).max())
    return a, b, exact, rounded, scale


def test_bfloat16_rounds_the_inputs_on_whichever_path_runs():
    """On every CPU: inside a "bfloat16" block the products are those of bfloat16-rounded inputs, and the
    block says which path did it — oneDNN's mode (float32 out, float32 accumulation) where that mode
    really engages, autocast (bfloat16 out) where it does not."""
    a, b, exact, rounded, scale = _rounded_case()
    with matmul_precision("bfloat16") as ran:
        y = a @ b
        lin = torch.nn.functional.linear(a, b.T.contiguous())
    assert ran == ("bfloat16" if bfloat16_path("cpu") == "onednn" else "bfloat16-autocast")
    assert ran == "bfloat16" or not onednn_bf16_mode_engages()
    for z in (y, lin):
        # far from float32's answer (the inputs were rounded) ...
        assert float((z.double() - exact).abs().max()) > 1e-2
        if ran == "bfloat16":  # ... equal, up to float32 accumulation, to the exact products of the rounded inputs
            assert z.dtype == torch.float32
            assert float((z.double() - rounded).abs().max()) < 1e-5 * scale
        else:  # ... the same, then rounded once more to bfloat16 on the way out (8 significant bits)
            assert z.dtype == torch.bfloat16
            assert float((z.double() - rounded).abs().max()) < 2.0 ** -8 * scale
    outside = a @ b  # outside the block: float32 again
    assert outside.dtype == torch.float32 and float((outside.double() - exact).abs().max()) < 1e-5 * scale
    assert "oneDNN" in describe_precision("bfloat16") and "autocast" in describe_precision("bfloat16-autocast")


def test_auto_records_what_ran():
    """"auto" yields float32 where bfloat16 products are not faster here, and then computes exactly what a
    plain float32 product computes (the same kernel, so bit for bit); else a bfloat16 path, measurably rounded."""
    a, b, exact, rounded, scale = _rounded_case(64, 256, 96)
    plain = a @ b
    with matmul_precision("auto") as ran:
        y = a @ b
    assert ran == ("float32" if not native_bfloat16("cpu") else
                   "bfloat16" if bfloat16_path("cpu") == "onednn" else "bfloat16-autocast")
    if ran == "float32":
        assert torch.equal(y, plain)
    else:
        assert float((y.double() - exact).abs().max()) > 1e-4 * scale
    assert native_bfloat16("cpu") == (cpu_bfloat16_speedup() >= FAST_RATIO)


def test_nesting_and_exceptions_restore_the_mode():
    before = _switch()
    a, b, *_ = _rounded_case(32, 64, 16)
    with pytest.raises(RuntimeError, match="boom"):
        with matmul_precision("bfloat16") as outer:
            with matmul_precision("bfloat16") as inner:
                assert inner == outer
            assert not torch.equal((a @ b).float(), _float32(a, b))  # still rounded
            raise RuntimeError("boom")
    assert _switch() == before and not torch.is_autocast_enabled("cpu")
    assert torch.equal(a @ b, _float32(a, b))


def _float32(a, b):
    with matmul_precision("float32"):
        return a @ b


def test_other_devices():
    with matmul_precision("auto", "meta") as p:  # no bfloat16 path there: auto is float32
        assert p == "float32"
    with pytest.raises(LensInputError, match="needs a CPU or a CUDA device"):
        with matmul_precision("bfloat16", "meta"):
            pass
    with pytest.raises(LensInputError, match="expected one of"):
        with matmul_precision("fp8", "meta"):
            pass


def test_a_float32_block_inside_a_bfloat16_block_is_float32():
    """The innermost block decides: a shortcut can be checked in float32 inside a bfloat16 study."""
    torch.manual_seed(0)
    a, b = torch.randn(128, 576), torch.randn(576, 200)
    before = _switch()
    plain = a @ b
    with matmul_precision("bfloat16"):
        rounded = a @ b
        with matmul_precision("float32") as p:
            assert p == "float32" and _switch() == before and not torch.is_autocast_enabled("cpu")
            exact = a @ b
            with matmul_precision("bfloat16"):
                assert not torch.equal((a @ b).float(), plain)
            assert _switch() == before
        assert torch.equal(a @ b, rounded)
    assert _switch() == before
    assert torch.equal(exact, plain) and exact.dtype == torch.float32
    assert not torch.equal(exact, rounded.float())


def test_forward_precision_casts_each_weight_once_and_changes_no_parameter(tiny_llama, monkeypatch):
    """Under autocast (forced here, whatever this CPU's path) an intervention block computes every linear
    layer with bfloat16 copies made once: its forwards equal autocast's per-call casts bit for bit; a float32
    block nested inside computes with the float32 weights, exactly as outside any block (the knob's check of
    its cached step does that); no parameter changes, and after the block (even after an exception) each
    linear layer's forward is its own again; a float32 block swaps nothing."""
    import lens.runtime.precision as P

    monkeypatch.setattr(P, "bfloat16_path", lambda device="cpu": "autocast")
    hf = tiny_llama.hf_model
    before = {n: (p, p.detach().clone()) for n, p in hf.named_parameters()}
    ids = torch.randint(0, hf.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    linears = [m for m in hf.modules() if type(m) is torch.nn.Linear]
    assert linears
    with torch.inference_mode():
        plain = hf(ids).logits
        with P.matmul_precision("bfloat16") as ran:
            per_call = hf(ids).logits
        with P.forward_precision("bfloat16", tiny_llama) as ran_once:
            assert all("forward" in vars(m) for m in linears)
            once = hf(ids).logits
            with P.matmul_precision("float32") as nested:
                nested_plain = hf(ids).logits
        with pytest.raises(RuntimeError, match="inside"):
            with P.forward_precision("bfloat16", tiny_llama):
                raise RuntimeError("inside")
        with P.forward_precision("float32", tiny_llama) as ran32:
            assert not any("forward" in vars(m) for m in linears)
    assert ran == ran_once == "bfloat16-autocast" and nested == ran32 == "float32"
    assert torch.equal(per_call, once) and not torch.equal(once.float(), plain)
    assert torch.equal(nested_plain, plain)
    assert not any("forward" in vars(m) for m in linears)
    assert all(p is before[n][0] and p.dtype == torch.float32 and torch.equal(p, before[n][1])
               for n, p in hf.named_parameters())


def test_the_bfloat16_timing_runs_on_one_thread_in_turns(monkeypatch):
    """The speedup is timed on one thread (a two-thread product on a busy machine is the threads' barrier, ~1x
    either dtype: the decision flipped between processes), float32 and bfloat16 in turns, and the thread count
    is given back afterwards."""
    import torch

    seen = []
    real = torch.matmul

    def spy(x, y):
        seen.append((x.dtype, torch.get_num_threads()))
        return real(x, y)

    monkeypatch.setattr(torch, "matmul", spy)
    before = torch.get_num_threads()
    cpu_bfloat16_speedup.__wrapped__()
    assert torch.get_num_threads() == before
    assert seen and all(threads == 1 for _, threads in seen)
    dtypes = [d for d, _ in seen[2:]]  # after the warm-up pair: float32, bfloat16, float32, ...
    assert dtypes[0::2] == [torch.float32] * len(dtypes[0::2]) and set(dtypes[1::2]) == {torch.bfloat16}
