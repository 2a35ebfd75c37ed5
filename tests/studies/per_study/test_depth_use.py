"""Depth use (issue #40, Csordás, Manning & Potts 2025): the relative updates against Hugging Face's own hidden
states and its attention / MLP module outputs, the skip scan against whole forward passes and against the
layer-ablation scan's cross-entropy, a model whose second half does nothing, the parts said absent in a parallel
family, the judged ratio and its rule, and the study end to end."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from studies.core.contract import AGREES, CONTRADICTS, UNDECIDED, WEAKER


def _windows(lengths=(12, 9, 12, 7), seed=0):
    rng = np.random.default_rng(seed)
    wins = [rng.integers(5, 1000, size=n) for n in lengths]
    return wins, [np.r_[w[1:], -1] for w in wins]


def test_relative_updates_equal_hugging_faces_hidden_states_and_module_outputs(tiny_llama):
    from lens.interventions.depth_use import depth_use_scan

    wins, tg = _windows()
    r = depth_use_scan(tiny_llama, wins, tg, batch_size=3, skip=False)
    hf = tiny_llama.hf_model
    outs = {}
    hooks = [blk.self_attn.register_forward_hook(lambda m, a, o, l=l: outs.__setitem__(("a", l), o[0]))
             for l, blk in enumerate(hf.model.layers)]
    hooks += [blk.mlp.register_forward_hook(lambda m, a, o, l=l: outs.__setitem__(("m", l), o))
              for l, blk in enumerate(hf.model.layers)]
    try:
        start = 0
        for w in wins:
            with torch.no_grad():
                hs = hf(input_ids=torch.tensor(w[None]), output_hidden_states=True).hidden_states
            n = len(w)
            for l in range(tiny_llama.n_layers - 1):  # hidden_states[L] is after the final norm: not a block output
                h, nxt = hs[l][0], hs[l + 1][0]
                a, m = outs[("a", l)][0], outs[("m", l)][0]
                want = ((nxt - h).norm(dim=-1) / h.norm(dim=-1)).numpy()
                np.testing.assert_allclose(r.rel_layer[l, start:start + n], want, rtol=1e-4)
                np.testing.assert_allclose(r.rel_attn[l, start:start + n], (a.norm(dim=-1) / h.norm(dim=-1)).numpy(),
                                           rtol=1e-4)
                np.testing.assert_allclose(r.rel_mlp[l, start:start + n],
                                           (m.norm(dim=-1) / (h + a).norm(dim=-1)).numpy(), rtol=1e-4)
            start += n
    finally:
        for hk in hooks:
            hk.remove()
    assert r.parts_absent == "" and r.rel_layer.shape == (tiny_llama.n_layers, sum(len(w) for w in wins))


def test_the_replayed_skip_scan_equals_whole_forward_passes_and_the_ablation_scans_ce(tiny_llama):
    from lens.interventions.ablation import ablation_scan
    from lens.interventions.depth_use import depth_use_scan

    wins, tg = _windows()
    a = depth_use_scan(tiny_llama, wins, tg, batch_size=3)
    b = depth_use_scan(tiny_llama, wins, tg, batch_size=3, replay=False)
    assert a.replayed and not b.replayed
    L = tiny_llama.n_layers
    later = np.arange(L)[None, :] > np.arange(L)[:, None]
    assert np.isnan(a.skip_effect[~later]).all() and np.isfinite(a.skip_effect[later]).all()
    np.testing.assert_allclose(a.skip_effect[later], b.skip_effect[later], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(a.skip_delta_ce, b.skip_delta_ce, atol=1e-5)
    ref = ablation_scan(tiny_llama, wins, tg, swap=False)  # another implementation of block deletion
    np.testing.assert_allclose(a.skip_delta_ce, ref.delta_ce_delete, atol=1e-5)
    assert abs(a.base_ce - ref.base_ce) < 1e-5


def test_a_second_half_that_adds_nothing_is_found(tiny_llama):
    """Known answer: blocks 2, 3 of a copy with their output projections zeroed add nothing to the residual — their
    relative update is 0, skipping them changes nothing, the judged ratio is 0 (agrees)."""
    from lens.interventions.depth_use import depth_use_scan
    from studies.depth_use.study import half_ratio

    model = copy.deepcopy(tiny_llama)
    for blk in model.hf_model.model.layers[2:]:
        torch.nn.init.zeros_(blk.self_attn.o_proj.weight)
        torch.nn.init.zeros_(blk.mlp.down_proj.weight)
    wins, tg = _windows()
    r = depth_use_scan(model, wins, tg, batch_size=4)
    assert np.abs(r.rel_layer[2:]).max() == 0 and (r.rel_layer[:2] > 0.01).all()
    np.testing.assert_allclose(r.skip_delta_ce[2:], 0, atol=1e-6)
    np.testing.assert_allclose(r.skip_effect[1, 2:], 0, atol=1e-6)  # a zero update stays zero: NaN-free, 0
    assert abs(r.skip_delta_ce[0]) > 1e-4
    assert half_ratio(r.rel_layer.mean(1), 4) == 0.0  # inner halves of 4 blocks: block 1, block 2
    assert half_ratio([9, 1, 1, 0, 0, 9], 6) == 0.0 and half_ratio([9, 1, 1, 1, 1, 9], 6) == 1.0
    assert half_ratio([1, 1, 1], 3) is None  # no inner halves


def test_a_parallel_family_says_its_parts_are_absent():
    import lens
    from lens.interventions.depth_use import depth_use_scan
    from lens.model.tiny import build_tiny

    model = lens.load_model(build_tiny("gpt_neox"))
    wins, tg = _windows((10, 8))
    r = depth_use_scan(model, wins, tg, batch_size=2, skip=False)
    assert r.rel_attn is None and r.rel_mlp is None
    assert r.parts_absent.startswith("absent") and "resid_mid" in r.parts_absent and "parallel" in r.parts_absent
    assert np.isfinite(r.rel_layer).all()


@pytest.mark.parametrize("value, low, high, want", [
    (0.3, 0.25, 0.35, AGREES), (0.7, 0.65, 0.75, WEAKER), (1.2, 1.1, 1.3, CONTRADICTS),
    (0.5, 0.45, 0.55, UNDECIDED)])
def test_the_half_ratio_rule(value, low, high, want):
    from tests.studies.verdict_records import judged_row, record

    rec = record("depth-use", {"second_half_ratio": value, "second_half_ratio_low": low,
                               "second_half_ratio_high": high})
    row = judged_row(rec, "relative update, second half / first half")
    assert row["verdict"] == want
    assert "Csordás" in row["source"] and "no single number" in row["paper"] and row["instrument"]


def test_the_study_runs_and_records_its_verdict(tmp_path):
    import json

    from studies.core.runner import run_study
    from studies.depth_use.study import Config

    out = run_study("depth-use", Config(model="tiny-llama", max_tokens=400, seq_len=32, sample_tokens=192,
                                        skip_tokens=32, n_boot=50, progress=False), tmp_path / "du")
    r = json.loads((out / "result.json").read_text())
    s, m = r["summary"], r["metrics"]
    assert s["parts"] == "present" and s["replayed"] is True and s["n_tokens_skip"] == 32
    assert s["second_half_ratio_low"] <= s["second_half_ratio"] <= s["second_half_ratio_high"]
    assert len(s["nested__second_half_ratio"]) == 3 and s["nested__second_half_ratio"][-1] == pytest.approx(
        s["second_half_ratio"], rel=1e-5)
    assert len(m["rel_contribution"]) == 4 and m["skip_future_effect"][-1] is None
    assert (out / "main.html").exists() or any(out.glob("*.html"))


def test_the_prediction_page_draws_depth_use_beside_prediction_gains(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from app.explorer.depth import depth_beside_gains
    from studies.reporting.results import find_results
    from tests.synthetic_runs import write_synthetic_run

    write_synthetic_run(tmp_path / "synth", n_layers=8, n_tokens=100, studies=("prediction-gains", "depth-use"))
    recs = {r.study: r for r in find_results(tmp_path)}
    fig = depth_beside_gains(recs["prediction-gains"], recs["depth-use"])
    names = [t.name for t in fig.data]
    assert "PR (held out)" in names and "relative update (attention + MLP)" in names
    assert any(n.startswith("Δ CE") for n in names) and "second half / first half" in fig.layout.title.text
    alone = depth_beside_gains(recs["prediction-gains"], None)  # no depth-use run: said, not an error
    assert any("depth-use" in a.text for a in alone.layout.annotations)
    monkeypatch.setenv("LENS_APP_RESULTS", str(tmp_path))
    monkeypatch.setenv("LENS_APP_STORES", str(tmp_path / "no-stores"))
    app = Path(__file__).resolve().parents[3] / "app" / "explorer" / "views" / "prediction.py"
    at = AppTest.from_file(str(app), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Depth use beside prediction gains" in h.value for h in at.subheader)


@pytest.mark.parametrize("param, words", [("skip_tokens=-1", "skip_tokens must be >= 0"),
                                          ("sample_tokens=x", "expected int"),
                                          ("precision=float8", "precision")])
def test_bad_settings_are_one_line_and_exit_2(tmp_path, capsys, param, words):
    from app.commands.cli import main

    assert main(["study", "depth-use", "--model", "tiny-llama", "--param", param, "--out", str(tmp_path / "o"),
                 "--quiet"]) == 2
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "o" / "result.json").exists()
