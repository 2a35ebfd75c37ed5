"""End to end on tiny models: logit-lens, tuned-lens and layer-ablation studies through the CLI,
with the issue's result keys, and bad input (encoder, missing layers, too few tokens) exiting 2."""

from __future__ import annotations

import numpy as np
import pytest

from app.commands.cli import main
from studies.reporting.results import read_result


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    """A small tiny-llama store with resid_post only (512 tokens of lee: two documents)."""
    import lens

    path = tmp_path_factory.mktemp("lens-store") / "tiny"
    lens.capture(lens.load_model("tiny-llama"), corpus="lee", sites=["resid_post"], layers="all", max_tokens=512,
                 seq_len=64, out=str(path), progress=False)
    return path


def test_logit_lens_cli_end_to_end(tmp_path):
    out = tmp_path / "ll"
    rc = main(["study", "logit-lens", "--model", "tiny-llama", "--corpus", "lee", "--max-tokens", "512",
               "--out", str(out), "--quiet", "--param", "topk_tokens=64"])
    assert rc == 0
    rec = read_result(out)
    assert rec.study == "logit-lens" and rec.layers == [0, 1, 2, 3]
    for key in ("ce", "kl_to_final", "top1_agreement", "entropy", "median_rank", "mid_ce"):
        assert len(rec.metrics[key]) == 4 and all(v is not None for v in rec.metrics[key]), key
    assert rec.summary["last_layer_max_abs_logit_diff"] < 1e-4
    assert rec.metrics["kl_to_final"][-1] == pytest.approx(0, abs=1e-5) and rec.metrics["top1_agreement"][-1] == 1
    a = rec.arrays()
    assert a["token_ce"].shape == (4, rec.n_tokens) and a["token_rank"].shape == (4, rec.n_tokens)
    assert a["topk_ids"].shape == (4, 64, 10) and a["topk_str"].shape == (4, 64, 10)
    assert a["ce_by_position"].shape[0] == 4
    assert {"main", "metrics", "positions"} <= set(rec.figure_paths)
    lo, hi = np.array(rec.metrics["ce_low"]), np.array(rec.metrics["ce_high"])
    assert np.all(lo <= np.array(rec.metrics["ce"]) + 1e-9) and np.all(np.array(rec.metrics["ce"]) <= hi + 1e-9)


def test_logit_lens_decodes_a_sample_of_whole_windows(store_dir, tmp_path):
    """``sample_tokens`` below the store's size: whole windows, their store rows in ``token_index``."""
    import lens

    store = lens.open_store(store_dir)
    out = tmp_path / "ll"
    rc = main(["study", "logit-lens", "--model", "tiny-llama", "--store", str(store_dir), "--out", str(out),
               "--quiet", "--param", "sample_tokens=100", "--param", "resid_mid=false"])
    assert rc == 0
    a = read_result(out).arrays()
    idx = a["token_index"]
    assert len(idx) == 100 == a["token_ce"].shape[1] and np.all(np.diff(idx) > 0)
    np.testing.assert_array_equal(a["token_id"], np.asarray(store.tokens["token_id"])[idx])
    assert set(a["topk_rows"].tolist()) <= set(idx.tolist())
    win = np.asarray(store.tokens["window"])
    full = [w for w in np.unique(win[idx])[:-1]]  # every window but the last one drawn is whole
    assert all(np.isin(np.nonzero(win == w)[0], idx).all() for w in full)


def test_tuned_lens_study_on_store(store_dir, tmp_path):
    from lens.readout.tuned_lens import TunedLens

    out = tmp_path / "tl"
    rc = main(["study", "tuned-lens", "--model", "tiny-llama", "--store", str(store_dir), "--out", str(out), "--quiet",
               "--param", "steps=5", "--param", "batch_tokens=32", "--param", "min_split_tokens=16",
               "--param", "jacobian_prompts=2"])
    assert rc == 0
    rec = read_result(out)
    for key in ("ce", "kl_to_final", "logit_lens_ce"):
        assert len(rec.metrics[key]) == 4 and all(v is not None for v in rec.metrics[key])
    # last layer: both lenses are the model's output
    assert rec.metrics["ce"][-1] == pytest.approx(rec.metrics["logit_lens_ce"][-1], rel=1e-6)
    assert TunedLens.load(out / "tuned_lens").layer_ids == [0, 1, 2]
    assert rec.arrays()["loss_history"].shape == (5, 3)
    # the Jacobian lens, third on the same tokens: the model's output at the last layer (J = I), two half-fits
    for key in ("jacobian_lens_ce", "jacobian_lens_kl", "jacobian_lens_top1_agreement", "jacobian_half_rel_diff",
                "jacobian_half_top1_agreement"):
        assert len(rec.metrics[key]) == 4 and all(v is not None for v in rec.metrics[key]), key
    assert rec.metrics["jacobian_lens_ce"][-1] == pytest.approx(rec.metrics["logit_lens_ce"][-1], rel=1e-6)
    assert rec.metrics["jacobian_half_rel_diff"][-1] == 0 and rec.metrics["jacobian_half_top1_agreement"][-1] == 1
    assert rec.summary["jacobian_n_prompts"] == 2 and "mean_ce_gain_jacobian" in rec.summary
    assert rec.arrays()["jacobian_lens_token_ce"].shape == rec.arrays()["token_ce"].shape


@pytest.mark.parametrize("study", ["tuned-lens", "logit-lens"])
def test_lens_studies_read_the_store_by_rows_never_a_whole_layer(study, store_dir, tmp_path, monkeypatch):
    """Memory at real scale: a lens study holds a chunk of one layer at a time (the least-squares start's
    chunks of at most 50k training rows, each training batch, each chunk of the held-out or lens sample),
    never a whole layer of the store (a million tokens × d 4096 is 16 GB a layer in float32)."""
    import lens

    n = lens.open_store(store_dir).n_tokens
    reads = []
    real = lens.Store.get
    monkeypatch.setattr(lens.Store, "get", lambda self, *a, **k: reads.append(k.get("rows")) or real(self, *a, **k))
    params = ["steps=3", "batch_tokens=32", "min_split_tokens=16", "sample_tokens=128", "chunk_size=64"] \
        if study == "tuned-lens" else ["sample_tokens=256", "chunk_size=64", "resid_mid=false", "check_windows=1"]
    rc = main(["study", study, "--model", "tiny-llama", "--store", str(store_dir), "--out", str(tmp_path / "r"),
               "--quiet", *[x for p in params for x in ("--param", p)]])
    assert rc == 0 and reads
    sizes = {None if r is None else len(r) for r in reads}
    assert None not in sizes and max(sizes) < n, sizes
    if study == "logit-lens":
        assert max(sizes) <= 64, sizes  # one chunk of one layer at a time
    else:  # the least-squares start's one chunk of training rows, the batches, the held-out chunks
        assert sizes - {32, 64} and max(sizes - {32, 64}) < n, sizes


def test_layer_ablation_study(store_dir, tmp_path):
    out = tmp_path / "ab"
    rc = main(["study", "layer-ablation", "--model", "tiny-llama", "--store", str(store_dir), "--out", str(out),
               "--quiet"])
    assert rc == 0
    rec = read_result(out)
    for key in ("retained_accuracy_delete", "retained_accuracy_swap", "delta_ce_delete", "delta_ce_swap"):
        assert len(rec.metrics[key]) == 4
    assert "retained_min" in rec.summary and "retained_max" in rec.summary
    assert rec.metrics["delta_ce_swap"][-1] is None and all(v is not None for v in rec.metrics["delta_ce_delete"])


@pytest.mark.parametrize("study", ["logit-lens", "tuned-lens", "layer-ablation"])
def test_encoder_exits_2(study, tmp_path, capsys):
    rc = main(["study", study, "--model", "tiny-bert", "--max-tokens", "64", "--out", str(tmp_path / "x"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "language-model head" in err and study in err
    assert not (tmp_path / "x").exists()


def test_store_missing_layers_exits_2(tmp_path, capsys):
    import lens

    path = tmp_path / "partial"
    lens.capture(lens.load_model("tiny-llama"), corpus="lee", sites=["resid_post"], layers="0,1", max_tokens=64,
                 seq_len=32, out=str(path), progress=False)
    rc = main(["study", "logit-lens", "--model", "tiny-llama", "--store", str(path), "--out", str(tmp_path / "o"),
               "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "lacks layers [2, 3]" in err


def test_too_few_tokens_for_split_exits_2(tmp_path, capsys):
    rc = main(["study", "tuned-lens", "--model", "tiny-llama", "--corpus", "lee", "--max-tokens", "40",
               "--seq-len", "32", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "tuned-lens" in err and "raise --max-tokens" in err


def test_layer_ablation_scores_a_sample_of_whole_windows(store_dir, tmp_path):
    import lens

    store = lens.open_store(store_dir)
    win = np.asarray(store.tokens["window"])
    first = int((win == win[0]).sum())
    out = tmp_path / "ab"
    rc = main(["study", "layer-ablation", "--model", "tiny-llama", "--store", str(store_dir), "--out", str(out),
               "--quiet", "--param", f"sample_tokens={first}", "--param", "swap=false"])
    assert rc == 0
    n = read_result(out).n_tokens
    # whole windows until sample_tokens: at least that many tokens, fewer than the store's
    assert first <= n < store.n_tokens


def test_pick_windows():
    from studies.core.sampling import pick_windows

    assert pick_windows([5, 5, 5], 0) is None and pick_windows([5, 5, 5], 15) is None
    got = pick_windows([5, 5, 5, 5], 7, seed=1)
    assert len(got) == 2 and np.all(np.diff(got) > 0)


@pytest.mark.parametrize("study,param", [("logit-lens", "sample_tokens"), ("tuned-lens", "eval_tokens"),
                                         ("layer-ablation", "eval_tokens")])
def test_negative_token_budget_is_refused(store_dir, tmp_path, capsys, study, param):
    rc = main(["study", study, "--model", "tiny-llama", "--store", str(store_dir), "--out", str(tmp_path / "x"),
               "--quiet", "--param", f"{param}=-5"])
    assert rc == 2 and ">= 0" in capsys.readouterr().err


def test_tuned_lens_splits_by_window_when_the_store_has_one_document(tmp_path):
    """A single-document corpus: "auto" holds out windows instead of failing."""
    text = tmp_path / "one.txt"
    text.write_text(" ".join(f"Sentence {i} of one long document about the river and its banks." for i in range(60)))
    out = tmp_path / "tl"
    rc = main(["study", "tuned-lens", "--model", "tiny-llama", "--corpus", str(text), "--max-tokens", "600",
               "--seq-len", "64", "--out", str(out), "--quiet", "--param", "steps=1"])
    assert rc == 0
    assert read_result(out).summary["split_unit"] == "window"
    rc = main(["study", "tuned-lens", "--model", "tiny-llama", "--corpus", str(text), "--max-tokens", "600",
               "--seq-len", "64", "--out", str(tmp_path / "tl2"), "--quiet", "--param", "split_by=doc"])
    assert rc == 2


def test_logit_lens_study_reuses_the_rows_prediction_gains_decoded(store_dir, tmp_path, monkeypatch):
    """In one process (a main job), prediction gains' logit-lens column draws its windows as the
    logit-lens study does: the study decodes only the rows the column did not, with the same results."""
    import lens.readout.logit_lens
    import lens.readout.store_lens as sl

    decoded = []
    real = lens.readout.logit_lens.token_metrics
    monkeypatch.setattr(sl, "token_metrics", lambda states, *a, **k: decoded.append(len(next(iter(states.values()))))
                        or real(states, *a, **k))
    common = ["--model", "tiny-llama", "--store", str(store_dir), "--quiet"]
    lens_args = ["--param", "sample_tokens=300", "--param", "resid_mid=false", "--param", "topk_tokens=16"]
    sl.clear()
    assert main(["study", "prediction-gains", *common, "--out", str(tmp_path / "pg"), "--param", "n_boot=20",
                 "--param", "logit_lens_max_tokens=150"]) == 0
    n_pg = sum(decoded)
    assert n_pg >= 150
    assert main(["study", "logit-lens", *common, "--out", str(tmp_path / "ll"), *lens_args]) == 0
    n_ll = sum(decoded) - n_pg
    assert n_ll <= 300 - n_pg + 16 + 64  # its top-k rows again, and at most one window's cut-off tail
    sl.clear()
    assert main(["study", "logit-lens", *common, "--out", str(tmp_path / "alone"), *lens_args]) == 0
    assert sum(decoded) - n_pg - n_ll == 300  # alone: every row once (the top-k rows first)
    shared, alone = read_result(tmp_path / "ll"), read_result(tmp_path / "alone")
    for key, values in alone.metrics.items():
        np.testing.assert_allclose(np.asarray(shared.metrics[key], float), np.asarray(values, float), atol=1e-5,
                                   err_msg=key)
    for key in ("token_ce", "token_kl", "token_rank", "topk_ids"):
        np.testing.assert_allclose(shared.arrays()[key], alone.arrays()[key], atol=1e-5, err_msg=key)
    # the column's mean CE is the lens CE of its own tokens
    pg = read_result(tmp_path / "pg")
    assert "whole windows" in pg.summary["logit_lens"]
    sl.clear()


def test_a_split_by_document_too_small_names_the_split_by_window():
    """Two documents, one of 3 tokens: held out by document, one side is too small; the message names the
    finer split a user can ask for, and that split works."""
    import lens
    from studies.tuned_lens.study import split_rows

    tokens = {"doc": np.array([0] * 200 + [1] * 3), "window": np.array([0] * 100 + [1] * 100 + [0] * 3)}
    mask = np.ones(203, bool)
    for seed in range(4):  # whichever document is held out, one side has 3 tokens
        with pytest.raises(lens.LensInputError, match=r"by doc: .*raise --max-tokens, or --param split_by=window"):
            split_rows(tokens, mask, 0.2, seed, 32, "doc")
    train, test, unit = split_rows(tokens, mask, 0.5, 0, 32, "window")
    assert unit == "window" and min(train.size, test.size) >= 32
