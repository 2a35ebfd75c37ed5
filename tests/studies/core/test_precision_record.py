"""The studies that run the model themselves record the arithmetic that really ran (lens.runtime.precision):
asked for bfloat16, they run oneDNN's bf16 mode where it engages and autocast where it does not, and
say which; asked for auto, they say float32 where bfloat16 products are not faster on this CPU."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lens.runtime.precision import bfloat16_path, describe_precision, native_bfloat16

_RAN = "bfloat16" if bfloat16_path("cpu") == "onednn" else "bfloat16-autocast"


def _summary(path):
    return json.loads((path / "result.json").read_text())["summary"]


def _filler(tmp_path, precision):
    from app.commands.cli import main

    out = tmp_path / precision
    assert main(["study", "filler-tokens", "--model", "tiny-llama", "--corpus", "lee", "--max-tokens", "200",
                 "--seq-len", "64", "--param", "n_random=1", "--param", "progress=false",
                 "--param", f"precision={precision}", "--out", str(out)]) == 0
    return _summary(out)


def test_filler_tokens_records_the_path_that_ran(tmp_path):
    f32, b16 = _filler(tmp_path, "float32"), _filler(tmp_path, "bfloat16")
    assert f32["precision"] == "float32"
    assert b16["precision"] == describe_precision(_RAN)
    # the same losses to bfloat16 rounding of the products (a random model: ~log(vocab) nats)
    for key in ("loss_original", "loss_filler", "loss_random"):
        assert np.isfinite(b16[key]) and b16[key] == pytest.approx(f32[key], abs=0.05)
        assert b16[key] != f32[key]  # and the rounding really happened


def test_auto_records_float32_or_the_bfloat16_path(tmp_path):
    auto = _filler(tmp_path, "auto")
    assert auto["precision"] == describe_precision(_RAN if native_bfloat16("cpu") else "float32")


def test_layer_ablation_and_knob_record_the_path_that_ran(tmp_path):
    from app.commands.cli import main

    assert main(["study", "layer-ablation", "--model", "tiny-llama", "--max-tokens", "300", "--seq-len", "64",
                 "--param", "precision=bfloat16", "--param", "eval_tokens=128", "--out", str(tmp_path / "ab"),
                 "--quiet"]) == 0
    assert _summary(tmp_path / "ab")["precision"] == describe_precision(_RAN)
    assert main(["study", "context-knob", "--model", "tiny-llama", "--param", "max_facts=10", "--param",
                 "require_known=false", "--param", "n_steer=2", "--param", "alphas=0,1", "--param",
                 "progress=false", "--param", "precision=bfloat16", "--out", str(tmp_path / "k")]) == 0
    s = _summary(tmp_path / "k")
    assert s["precision"] == describe_precision(_RAN)
    assert np.isfinite(s["baseline_context_share"])
