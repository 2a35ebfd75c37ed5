"""End to end on tiny-llama: prediction-gains, probes and context-memory studies and their CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.commands.cli import main
from studies.reporting.results import read_result


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    """One small tiny-llama store (embed + resid_post, 512 tokens of wiki-sample) for the studies."""
    import lens

    path = tmp_path_factory.mktemp("store") / "tiny"
    model = lens.load_model("tiny-llama")
    lens.capture(model, corpus="wiki-sample", sites=["embed", "resid_post"], layers="all", max_tokens=512,
                 seq_len=128, batch_size=8, out=str(path), progress=False)
    return path


def test_prediction_gains_cli_end_to_end(tmp_path):
    out = tmp_path / "pg"
    rc = main(["study", "prediction-gains", "--model", "tiny-llama", "--corpus", "wiki-sample",
               "--max-tokens", "512", "--out", str(out), "--quiet", "--param", "n_boot=50"])
    assert rc in (0, None)
    rec = read_result(out)
    assert rec.study == "prediction-gains" and rec.model == "tiny-llama" and rec.layers == [0, 1, 2, 3]
    for key in ("pr", "pr_low", "pr_high", "pr_in_sample", "pr_token_id"):
        assert len(rec.metrics[key]) == 4 and all(v is not None for v in rec.metrics[key])
    for key in ("pearson_r", "decay_ratio", "slope_log10", "pearson_r_in_sample", "decay_ratio_in_sample"):
        assert key in rec.summary
    # a random-weight model predicts nothing: held-out PR is about 1
    assert np.all(np.abs(rec.metric("pr") - 1) < 0.1)
    # the logit lens beside it: a random model's lens is near-uniform over the 49152-token vocab
    ce = rec.metric("logit_lens_ce")
    assert np.all(np.abs(ce - np.log(49152)) < 0.5) and rec.metrics["logit_lens_ce_drop"][0] is None
    arrays = rec.arrays()
    assert arrays["boot_pr"].shape == (50, 4)
    assert "logit-lens" in rec.figure_paths
    assert "main" in rec.figure_paths and "main" in rec.figures()


def test_prediction_gains_too_few_tokens_exits_2(tmp_path, capsys):
    rc = main(["study", "prediction-gains", "--model", "tiny-llama", "--max-tokens", "64", "--seq-len", "32",
               "--out", str(tmp_path / "x"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "prediction-gains" in err and "raise --max-tokens" in err
    assert not (tmp_path / "x" / "result.json").exists()


def test_probes_study(store_dir, tmp_path):
    rc = main(["study", "probes", "--model", "tiny-llama", "--store", str(store_dir), "--out",
               str(tmp_path / "p"), "--quiet", "--param", "letter=e"])
    assert rc in (0, None)
    rec = read_result(tmp_path / "p")
    acc, sel = rec.metric("accuracy"), rec.metric("selectivity")
    assert acc.shape == (4,) and np.all((acc >= 0) & (acc <= 1))
    np.testing.assert_allclose(sel, acc - rec.metric("control_accuracy"))
    assert abs(sum(rec.metrics["mix_weight"]) - 1) < 1e-5
    assert rec.summary["letter"] == "e" and 0 < rec.summary["positive_share"] < 1
    assert rec.summary["control_strength"] == "shared"


@pytest.mark.parametrize("param", ["letter=ab", "control_strength=both"])
def test_probes_study_bad_param(store_dir, tmp_path, capsys, param):
    rc = main(["study", "probes", "--model", "tiny-llama", "--store", str(store_dir), "--out",
               str(tmp_path / "p"), "--quiet", "--param", param])
    assert rc == 2 and param.split("=")[0] in capsys.readouterr().err


def test_context_memory_study(store_dir, tmp_path):
    rc = main(["study", "context-memory", "--model", "tiny-llama", "--store", str(store_dir), "--out",
               str(tmp_path / "c"), "--quiet", "--param", "k=2"])
    assert rc in (0, None)
    rec = read_result(tmp_path / "c")
    data = json.loads((tmp_path / "c" / "result.json").read_text())
    assert "corr_with_nonlinearity" in data["summary"] and data["summary"]["k"] == 2
    assert "all" in rec.metrics and {"content", "punctuation"} <= set(rec.metrics)
    assert rec.metrics["corr_nonlinearity"][-1] is None
    assert rec.summary["top_class"] in rec.metrics and rec.summary["top_class_gain"] in rec.metrics
    np.testing.assert_allclose(rec.metric("all_gain"), rec.metric("all") - rec.summary["embed_baseline_all"])
