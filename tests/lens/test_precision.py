"""lens.precision: one vocabulary for precision settings, and the bfloat16 matmul mode's contract —
float32 tensors in and out, only the products' inputs rounded, the previous mode restored."""

from __future__ import annotations

import pytest
import torch

from lens.errors import LensInputError
from lens.precision import PRECISIONS, describe_precision, matmul_precision, native_bfloat16, resolve_precision

needs_bf16 = pytest.mark.skipif(not native_bfloat16("cpu"), reason="this CPU has no native bfloat16")


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


@needs_bf16
def test_bfloat16_rounds_only_the_inputs():
    torch.manual_seed(0)
    a, b = torch.randn(256, 576), torch.randn(576, 300)
    exact = a.double() @ b.double()
    rounded = a.bfloat16().double() @ b.bfloat16().double()  # the products of the rounded inputs, exactly
    with matmul_precision("bfloat16") as p:
        assert p == "bfloat16"
        y = a @ b
        lin = torch.nn.functional.linear(a, b.T.contiguous())
    assert y.dtype == torch.float32 and lin.dtype == torch.float32
    # far from float32's answer (the inputs were rounded) ...
    assert (y.double() - exact).abs().max() > 1e-2
    # ... and equal, up to float32 accumulation, to the exact products of the bfloat16-rounded inputs
    scale = (a.bfloat16().double().abs() @ b.bfloat16().double().abs()).max()
    assert (y.double() - rounded).abs().max() < 1e-5 * scale
    assert (lin.double() - rounded).abs().max() < 1e-5 * scale
    assert torch.equal(a @ b, (a @ b))  # outside the block: float32 again
    assert ((a @ b).double() - exact).abs().max() < 1e-5 * scale


@needs_bf16
def test_nesting_and_exceptions_restore_the_mode():
    before = _switch()
    with pytest.raises(RuntimeError, match="boom"):
        with matmul_precision("bfloat16"):
            with matmul_precision("auto"):
                assert _switch() == "bf16"
            assert _switch() == "bf16"  # the inner block does not undo the outer one
            raise RuntimeError("boom")
    assert _switch() == before


def test_other_devices():
    with matmul_precision("auto", "meta") as p:  # no CPU bf16 mode there: auto is float32
        assert p == "float32"
    with pytest.raises(LensInputError, match="needs a CPU"):
        with matmul_precision("bfloat16", "meta"):
            pass


@needs_bf16
def test_a_float32_block_inside_a_bfloat16_block_is_float32():
    """The innermost block decides: a shortcut can be checked in float32 inside a bfloat16 study."""
    torch.manual_seed(0)
    a, b = torch.randn(128, 576), torch.randn(576, 200)
    before = _switch()
    with matmul_precision("bfloat16"):
        rounded = a @ b
        with matmul_precision("float32") as p:
            assert p == "float32" and _switch() == before
            exact = a @ b
            with matmul_precision("auto"):
                assert _switch() == "bf16"
            assert _switch() == before
        assert _switch() == "bf16"
        assert torch.equal(a @ b, rounded)
    assert _switch() == before
    assert torch.equal(exact, a @ b)
    assert not torch.equal(exact, rounded)
