"""The anisotropy and linearity claims, judged on the papers' statistics (issue #37): synthetic records on each
side of every threshold and one whose interval straddles it (undecided), through ``studies.reporting.headlines.judged``;
what makes an old result not applicable; and both studies end to end on tiny-llama (interval, nested
subsamples, null p-value, the paper's token set for linearity with the sink-free score beside it)."""

from __future__ import annotations


import numpy as np
import pytest

from studies.core.contract import AGREES, CONTRADICTS, NOT_APPLICABLE, UNDECIDED, WEAKER

BASE = dict(model="tiny-llama", corpus="wiki-sample", max_tokens=384, seq_len=64, progress=False)


from tests.studies.verdict_records import judged_row, record as _record


def _row(study, summary, config=None):
    return judged_row(_record(study, summary, config=config))


# ---------------------------------------------------------------------------- anisotropy (Ethayarajh 2019)
@pytest.mark.parametrize("value,low,high,verdict", [
    (0.35, 0.30, 0.41, AGREES),          # every layer well above the isotropic null's quantile
    (0.12, 0.105, 0.14, AGREES),         # above it by more than 0.1 in every layer
    (0.004, 0.001, 0.009, WEAKER),       # every resample above the null, but by less than the paper's layers
    (0.06, 0.03, 0.09, WEAKER),
    (-0.002, -0.004, -0.001, CONTRADICTS),  # some layer as isotropic as the null
    (0.01, -0.003, 0.02, UNDECIDED),     # straddles the null's quantile
    (0.1, 0.08, 0.13, UNDECIDED),        # straddles 0.1
])
def test_anisotropy_each_side_of_the_threshold_and_a_straddling_interval(value, low, high, verdict):
    row = _row("anisotropy", {"mean_cosine_excess_min": value, "mean_cosine_excess_low": low,
                              "mean_cosine_excess_high": high})
    assert row["verdict"] == verdict, row
    assert row["paper"] and row["method"] and row["reason"] == "" and row["instrument"] == ""
    assert "Ethayarajh" in row["source"] and "null" in row["rule"]


def test_an_anisotropy_result_without_the_null_is_not_applicable_with_the_reason():
    row = _row("anisotropy", {"max_mean_cosine": 0.8})  # the old statistic alone: no null to judge it against
    assert row["verdict"] == NOT_APPLICABLE and "isotropic null" in row["reason"] and "rerun" in row["reason"]


def test_anisotropy_nested_values_and_the_null_p_reach_the_row():
    from studies.reporting.headlines import verdict_text

    summary = {"mean_cosine_excess_min": 0.2, "mean_cosine_excess_low": 0.18, "mean_cosine_excess_high": 0.22,
               "nested__mean_cosine_excess": [0.4, 0.25, 0.2], "nested_n__mean_cosine_excess": [100, 200, 400],
               "null__mean_cosine_excess": -0.001, "null_p__mean_cosine_excess": 0.001}
    row = _row("anisotropy", summary)
    assert row["verdict"] == AGREES and row["unstable"] is True and row["null_p"] == 0.001
    assert "unstable" in verdict_text(row) and "null p = 0.001" in verdict_text(row)


# ---------------------------------------------------------------------------- linearity (Razzhigaev et al. 2024)
@pytest.mark.parametrize("value,low,high,verdict", [
    (0.99, 0.987, 0.993, AGREES),
    (0.95, 0.94, 0.96, WEAKER),
    (0.80, 0.78, 0.82, CONTRADICTS),
    (0.981, 0.975, 0.986, UNDECIDED),  # straddles 0.98
    (0.905, 0.89, 0.92, UNDECIDED),    # straddles 0.9
])
def test_linearity_each_side_of_each_threshold_and_straddling_intervals(value, low, high, verdict):
    row = _row("linearity", {"linearity_mean": value, "linearity_mean_low": low, "linearity_mean_high": high},
               config={"min_pos": 0, "drop_special": False})
    assert row["verdict"] == verdict, row
    assert row["paper"] and row["method"] and row["reason"] == ""
    assert "position 0" in row["paper"] and "sink-free" in row["method"]


@pytest.mark.parametrize("config,missing", [({"min_pos": 1, "drop_special": True}, "position 0"),
                                            ({"min_pos": 1, "drop_special": False}, "position 0"),
                                            ({"min_pos": 0, "drop_special": True}, "special tokens")])
def test_a_linearity_result_scored_without_the_papers_tokens_is_not_applicable(config, missing):
    """The old default left out position 0 (0.959 without it against 0.988 with it on one corpus)."""
    row = _row("linearity", {"linearity_mean": 0.959}, config=config)
    assert row["verdict"] == NOT_APPLICABLE and missing in row["reason"] and "skip_first=0" in row["reason"]


# ---------------------------------------------------------------------------- end to end on tiny-llama
def test_the_anisotropy_study_judges_with_interval_nested_values_and_null(tmp_path):
    from studies.anisotropy import study as anisotropy
    from studies.reporting.headlines import judged
    from studies.reporting.results import read_result
    from studies.core.runner import run_study

    cfg = anisotropy.Config(**BASE, postprocessing=("standardize",), min_count=2, null_draws=199, n_boot=200)
    rec = read_result(run_study("anisotropy", cfg, tmp_path / "an"))
    s, m = rec.summary, rec.metrics
    row = judged(rec)[0]
    assert row["verdict"] in (AGREES, CONTRADICTS, UNDECIDED)
    assert row["low"] <= row["value"] <= row["high"] or row["verdict"] == UNDECIDED
    assert len(row["nested"]) == 3 and row["nested"][-1] == pytest.approx(row["value"], abs=1e-6)
    assert 0 < row["null_p"] <= 1 and s["nested_n__mean_cosine_excess"][-1] == rec.n_tokens
    mc, q = np.asarray(m["mean_cosine"], float), np.asarray(m["mean_cosine_null_quantile"], float)
    assert row["value"] == pytest.approx(float((mc - q).min()), abs=1e-5)
    assert np.all(np.asarray(m["mean_cosine_low"]) <= np.asarray(m["mean_cosine_high"]))  # percentile: may miss mc
    plain, corr = np.asarray(m["participation_ratio"]), np.asarray(m["participation_ratio_corrected"])
    assert np.all(plain > 0) and np.all(np.isfinite(corr))
    assert s["bootstrap_unit"] in ("doc", "window") and s["n_units"] >= 2


def test_the_linearity_study_scores_every_token_and_reports_the_sink_free_score_beside_it(tmp_path):
    import lens
    from studies.linearity import study as linearity
    from studies.reporting.headlines import headlines_for, judged
    from studies.reporting.results import read_result
    from studies.core.runner import run_study

    cfg = linearity.Config(**BASE, store=str(tmp_path / "store"), null_permutations=4, n_boot=200)
    rec = read_result(run_study("linearity", cfg, tmp_path / "lin"))
    s = rec.summary
    store = lens.open_store(tmp_path / "store")
    assert rec.n_tokens == int(store.mask(False, 0).sum())  # every token, position 0 included
    assert s["sink_free_tokens"] == int(store.mask(True, 1).sum()) < rec.n_tokens
    assert len(rec.metrics["linearity_sink_free"]) == len(rec.layers)
    assert s["linearity_sink_free_mean"] == pytest.approx(np.mean(rec.metrics["linearity_sink_free"]))
    row = judged(rec)[0]
    assert row["reason"] == "" and row["verdict"] != NOT_APPLICABLE
    assert row["low"] is not None and row["low"] <= s["linearity_mean"] <= row["high"]
    assert row["nested"][-1] == pytest.approx(s["linearity_mean"], abs=1e-6) and len(row["nested"]) == 3
    assert row["null_p"] == pytest.approx(1 / 5) and row["null"] < s["linearity_min"]
    assert s["linearity_mean_large_n"] == pytest.approx(linearity.large_n(row["nested"], s["nested_n__linearity_mean"]))
    assert linearity.large_n([0.99, 0.985, 0.98], [100, 200, 400]) < 0.98  # the in-sample score falls with n
    assert linearity.large_n([None, None, 0.98], [100, 200, 400]) is None
    labels = [h["label"] for h in headlines_for(rec)]
    assert any("sink-free" in label for label in labels)


@pytest.mark.parametrize("shift,expected", [(0.0, (CONTRADICTS, UNDECIDED)), (0.6, (AGREES,))])
def test_the_anisotropy_judgement_on_an_isotropic_cloud_and_on_a_cone(shift, expected):
    """Structureless layers (isotropic Gaussian): the mean cosine is not above the null, p not small; a shared
    direction in every layer: above it in every layer, p = 1 / (1 + draws)."""
    from studies.anisotropy import study as anisotropy
    from studies.anisotropy.declaration import CLAIMS

    rng = np.random.default_rng(11)
    mats = [rng.standard_normal((1500, 16)) * np.linspace(0.5, 2.0, 16) + shift for _ in range(3)]
    units = np.arange(1500) // 30
    cfg = anisotropy.Config(null_draws=199, n_boot=300)
    metrics, summary = anisotropy.isotropy_judgement(mats, [0, 1, 2], units, cfg)
    verdict = CLAIMS[0].rule.verdict(summary["mean_cosine_excess_min"], summary["mean_cosine_excess_low"],
                                     summary["mean_cosine_excess_high"])
    assert verdict in expected, summary
    p = summary["null_p__mean_cosine_excess"]
    assert (p > 0.05) if shift == 0 else p == pytest.approx(1 / 200)
    assert len(metrics["participation_ratio_corrected"]) == 3
    if shift == 0:  # an isotropic cloud of unequal spreads: corrected PR near its population value
        lam = np.linspace(0.5, 2.0, 16) ** 2
        assert np.mean(metrics["participation_ratio_corrected"]) == pytest.approx(lam.sum() ** 2 / (lam ** 2).sum(),
                                                                               rel=0.05)


def test_bad_null_and_bootstrap_settings_are_refused_before_any_work():
    from lens.errors import LensInputError
    from studies.anisotropy import study as anisotropy
    from studies.linearity import study as linearity

    for bad in (dict(null_draws=5), dict(n_boot=1), dict(null_quantile=0.4)):
        with pytest.raises(LensInputError):
            anisotropy.check(anisotropy.Config(**BASE, **bad))
    for bad in (dict(null_permutations=0), dict(n_boot=1)):
        with pytest.raises(LensInputError):
            linearity.Config(**BASE, **bad)
