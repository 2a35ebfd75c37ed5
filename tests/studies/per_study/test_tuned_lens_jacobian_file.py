"""The tuned-lens study reads a Jacobian lens fitted elsewhere (``--param jacobian_lens=PATH``) and refuses, in one
line with exit 2, a lens fitted on another model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import lens
from app.commands.cli import main
from lens.readout.jacobian_fit import fit_sums, settings_for
from studies.reporting.results import read_result

STUDY = ["study", "tuned-lens", "--model", "tiny-llama", "--corpus", "lee", "--max-tokens", "600", "--quiet",
         "--param", "steps=2", "--param", "batch_tokens=16", "--param", "min_split_tokens=16", "--param", "nested=false"]


def test_a_fitted_lens_file_is_read_and_another_models_refused(tmp_path, capsys):
    model = lens.load_model("tiny-llama")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(5, 500, 20) for _ in range(3)]
    sums = fit_sums(model, prompts, settings_for(model, skip_first=4, max_seq_len=20), dim_batch=64)
    sums.save(tmp_path / "jl.safetensors")
    rc = main([*STUDY, "--store", str(tmp_path / "store"), "--out", str(tmp_path / "tl"),
               "--param", f"jacobian_lens={tmp_path / 'jl.safetensors'}"])
    assert rc == 0
    rec = read_result(tmp_path / "tl")
    assert rec.summary["jacobian_n_prompts"] == 3 and "read from" in rec.summary["jacobian_note"]
    assert "jacobian_half_rel_diff" not in rec.metrics  # one file: no halves to compare
    assert rec.metrics["jacobian_lens_ce"][-1] == pytest.approx(rec.metrics["logit_lens_ce"][-1], rel=1e-6)

    other = dataclasses.replace(sums, settings=dataclasses.replace(sums.settings, model_id="tiny-gpt2"))
    other.save(tmp_path / "other.safetensors")
    capsys.readouterr()
    rc = main([*STUDY, "--store", str(tmp_path / "store"), "--out", str(tmp_path / "tl2"),
               "--param", f"jacobian_lens={tmp_path / 'other.safetensors'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "fitted on tiny-gpt2, not tiny-llama" in err[0], err
    assert not (tmp_path / "tl2" / "result.json").exists()


def test_the_logit_lens_study_decodes_a_jacobian_lens_file_for_the_grid(tmp_path):
    from app.explorer import grid

    model = lens.load_model("tiny-llama")
    rng = np.random.default_rng(1)
    sums = fit_sums(model, [rng.integers(5, 500, 20) for _ in range(2)],
                    settings_for(model, skip_first=4, max_seq_len=20), dim_batch=64)
    sums.save(tmp_path / "jl.safetensors")
    rc = main(["study", "logit-lens", "--model", "tiny-llama", "--corpus", "lee", "--max-tokens", "300", "--quiet",
               "--out", str(tmp_path / "ll"), "--param", "resid_mid=false", "--param", "sample_tokens=0",
               "--param", f"jacobian_lens={tmp_path / 'jl.safetensors'}"])
    assert rc == 0
    rec = read_result(tmp_path / "ll")
    assert rec.metrics["jacobian_ce"][-1] == pytest.approx(rec.metrics["ce"][-1], rel=1e-6)  # J = I at the last
    a = rec.arrays()
    assert "jacobian" in grid.lenses(a) and a["jacobian_grid_topk"].shape == a["grid_topk"].shape
    g = grid.build_grid(a, rec.layers, lens="jacobian", colour="ce", start=0, stop=8)
    assert g.top1.shape == (4, 8)
    # at the last layer the Jacobian lens' top tokens are the logit lens'
    assert (a["jacobian_grid_topk"][-1] == a["grid_topk"][-1]).all()
