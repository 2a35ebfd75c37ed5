"""The three geometry studies end to end on tiny-llama (a few hundred tokens), and one CLI run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lens.errors import LensInputError
from studies.anisotropy import study as anisotropy
from studies.intrinsic_dim import study as intrinsic_dim
from studies.linearity import study as linearity
from studies.reporting.results import read_result
from studies.core.sampling import sample_mask
from studies.core.runner import run_study

ROOT = Path(__file__).resolve().parents[3]
BASE = dict(model="tiny-llama", corpus="wiki-sample", max_tokens=384, seq_len=64, progress=False)


def _check_contract(rec, study, keys, n_layers):
    assert rec.study == study and rec.model == "tiny-llama" and rec.n_tokens > 0
    for key in keys:
        assert key in rec.metrics, key
        assert len(rec.metrics[key]) == n_layers
    assert "main" in rec.figure_paths and rec.figures()


def test_intrinsic_dim_study(tmp_path):
    cfg = intrinsic_dim.Config(**BASE, subsample=150, n_bootstrap=4, store=str(tmp_path / "store"))
    rec = read_result(run_study("intrinsic-dim", cfg, tmp_path / "id"))
    # the control is captured into its own store, with the shuffle recorded in its manifest
    manifest = json.loads((tmp_path / "store-shuffled" / "manifest.json").read_text())
    assert manifest["corpus"]["transform"]["kind"] == "shuffle"
    assert json.loads((tmp_path / "store" / "manifest.json").read_text())["corpus"]["transform"] is None
    keys = ("twonn", "twonn_low", "twonn_high", "mle", "twonn_shuffled")
    _check_contract(rec, "intrinsic-dim", keys, 4)
    assert rec.layers == [0, 1, 2, 3]
    tw, lo, hi = rec.metric("twonn"), rec.metric("twonn_low"), rec.metric("twonn_high")
    assert np.all(np.isfinite(tw)) and np.all(lo <= tw) and np.all(tw <= hi)
    assert np.all(np.isfinite(rec.metric("twonn_shuffled")))
    assert rec.arrays()["twonn_replicates"].shape == (4, 4)
    assert rec.config["subsample"] == 150
    # the sequence-level cloud (the judged hunchback): one point per window, its last token (a causal model)
    assert rec.summary["seq_pooling"] == "last" and rec.summary["seq_n_sequences"] == 6
    assert np.all(np.isfinite(rec.metric("seq_twonn"))) and "null_p__seq_hunchback" in rec.summary


def test_shuffled_control_is_captured_for_the_points_it_gives_not_the_whole_store(tmp_path):
    """The control serves at most ``sample_tokens`` points: it is captured from about that many tokens (a
    million-token store does not cost a second million-token capture), and from the whole budget when
    ``sample_tokens`` is 0 (every token)."""
    import lens

    cfg = intrinsic_dim.Config(**BASE, subsample=40, n_bootstrap=2, sample_tokens=100, max_sequences=1,
                               store=str(tmp_path / "store"))
    budget = intrinsic_dim.control_tokens(cfg)
    assert 100 < budget == int(np.ceil(100 * 64 / 62 * 1.25)) < 384
    # the sequence-level cloud asks for its max_sequences whole windows (a quarter spare) when that is more
    assert intrinsic_dim.control_tokens(intrinsic_dim.Config(**BASE, sample_tokens=100, max_sequences=4)) == 320
    rec = read_result(run_study("intrinsic-dim", cfg, tmp_path / "id"))
    real, control = lens.open_store(tmp_path / "store"), lens.open_store(tmp_path / "store-shuffled")
    assert real.n_tokens == 384 and budget - 64 < control.n_tokens <= budget
    assert 100 <= rec.extra["n_tokens_shuffled"] < rec.n_tokens
    every = intrinsic_dim.Config(**BASE, sample_tokens=0)
    assert intrinsic_dim.control_tokens(every) == 0 and intrinsic_dim.needs(every).control_tokens == 0
    from studies.core.runner import control_config

    assert control_config(every, intrinsic_dim.needs(every)).max_tokens == 384
    assert control_config(cfg, intrinsic_dim.needs(cfg)).max_tokens == budget


def test_anisotropy_study(tmp_path):
    cfg = anisotropy.Config(**BASE, postprocessing=("standardize", "remove_top"), min_count=2,
                            store=str(tmp_path / "store"))
    rec = read_result(run_study("anisotropy", cfg, tmp_path / "an"))
    keys = ("mean_cosine", "top_pc_share", "self_similarity", "intra_sentence_similarity", "mev", "rogue_share",
            "rogue_dims", "self_similarity_adjusted", "mean_cosine__standardize")
    _check_contract(rec, "anisotropy", keys, 4)
    assert all(len(dims) == 3 for dims in rec.metrics["rogue_dims"])
    assert abs(np.mean(rec.metric("mean_cosine__standardize"))) < 0.05
    assert set(rec.figure_paths) >= {"main", "rogue", "postprocessing", "outliers"}
    assert rec.arrays()["cosine_contributions"].shape == (4, 64)
    # the norm ratio read in chunks of rows equals the one read a whole layer at a time, and below
    # sample_tokens the analysed rows are every row of the mask
    import torch

    import lens

    store = lens.open_store(tmp_path / "store")
    for drop, min_pos in ((True, 1), (True, 0), (False, 3)):
        rows, drawn = sample_mask(store, drop, min_pos, 10 ** 6, 0)
        assert drawn is None and np.array_equal(rows, np.flatnonzero(store.mask(drop, min_pos)))
        ratios = anisotropy.position_norm_ratio(store, drop, max(1, min_pos))
        assert anisotropy._norm_ratios(store, drop, min_pos, [0, 1, 2, 3]) == ratios
        small = anisotropy.NORM_CHUNK_BYTES
        try:
            anisotropy.NORM_CHUNK_BYTES = 4 * store.d_model * 37  # 37-row chunks
            assert anisotropy._norm_ratios(store, drop, min_pos, [0, 1, 2, 3]) == ratios
        finally:
            anisotropy.NORM_CHUNK_BYTES = small
    assert rec.metrics["position0_norm_ratio"] == anisotropy.position_norm_ratio(store, True, 1)
    assert rec.extra["sample"] is None
    # above sample_tokens: whole windows drawn with the seed, recorded in the result
    n = int(store.mask(True, 1).sum())
    cfg = anisotropy.Config(**BASE, postprocessing=("standardize",), min_count=2, store=str(tmp_path / "store"),
                            sample_tokens=n // 3)
    rec = read_result(run_study("anisotropy", cfg, tmp_path / "an-sampled"))
    drawn = rec.extra["sample"]
    assert drawn["of"] == n and n // 3 <= drawn["tokens"] < n and drawn["seed"] == cfg.seed
    assert rec.n_tokens == drawn["tokens"]
    rows, again = sample_mask(store, True, 1, n // 3, cfg.seed)
    assert again == drawn and len(np.unique(np.asarray(store.tokens["window"])[rows])) < \
        len(np.unique(np.asarray(store.tokens["window"])[store.mask(True, 1)]))
    assert rec.layers == [0, 1, 2, 3] and np.all(np.isfinite(rec.metric("mean_cosine")))
    assert rec.config["max_occurrences"] == 256  # MEV's cap on a word type's occurrences, recorded
    for bad in (1, -3):
        with pytest.raises(LensInputError, match="max_occurrences must be 0"):
            anisotropy.check(anisotropy.Config(**BASE, max_occurrences=bad))
    assert torch.equal(store.get(layer=2, rows=rows), store.get(layer=2)[torch.from_numpy(rows)])


def test_linearity_study(tmp_path):
    rec = read_result(run_study("linearity", linearity.Config(**BASE), tmp_path / "lin"))
    _check_contract(rec, "linearity", ("linearity", "linearity_centered", "nonlinearity_mean"), 3)
    assert rec.layers == [0, 1, 2]
    lin = rec.metric("linearity")
    assert np.all((lin > 0) & (lin <= 1))
    arr = rec.arrays()
    assert arr["nonlinearity"].shape == (3, rec.n_tokens) and arr["token"].shape == (rec.n_tokens,)
    assert rec.summary["most_nonlinear_class"] in rec.summary["class_nonlinearity"]


def test_linearity_refuses_fewer_tokens_than_dimensions(tmp_path):
    with pytest.raises(LensInputError, match="more tokens than d_model"):
        run_study("linearity", linearity.Config(**{**BASE, "max_tokens": 40}), tmp_path / "few")


def test_store_missing_a_layer_gives_clear_error(tmp_path):
    import lens

    lens.capture("tiny-llama", corpus="wiki-sample", sites=["resid_post"], layers="0,3", max_tokens=200,
                 seq_len=64, out=tmp_path / "store", progress=False)
    cfg = linearity.Config(**BASE, store=str(tmp_path / "store"))
    with pytest.raises(LensInputError, match=r"lacks layers \[1, 2\]"):
        run_study("linearity", cfg, tmp_path / "out")


def test_cli_intrinsic_dim(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "app", "study", "intrinsic-dim", "--model", "tiny-llama", "--corpus", "wiki-sample",
         "--max-tokens", "512", "--out", str(tmp_path / "cli"), "--quiet"],
        capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "cli" / "result.json").read_text())
    assert {"twonn", "twonn_low", "twonn_high", "mle", "twonn_shuffled"} <= set(data["metrics"])
    assert data["study"] == "intrinsic-dim" and data["n_tokens"] > 0
