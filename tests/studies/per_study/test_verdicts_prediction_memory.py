"""Verdicts of prediction-gains and context-memory (issue #37): every rule on synthetic records on each side
of each threshold and straddling it (undecided), read through ``studies.reporting.headlines.judged``; and the paper's
recipe of the prediction residual (in-sample least squares of the next token's id) on states whose answer
is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from studies.core.contract import AGREES, CONTRADICTS, NOT_APPLICABLE, UNDECIDED, WEAKER


from tests.studies.verdict_records import judged_row as _row, record as _record


# ---------------------------------------------------------------------------- prediction-gains
def _law(r, low=None, high=None, nested=None):
    from studies.prediction_gains.declaration import S

    summary = {S.pearson_r_token_id: r, S.pearson_r_token_id_low: low, S.pearson_r_token_id_high: high}
    if nested is not None:
        summary[f"nested__{S.pearson_r_token_id}"] = nested
    return _row(_record("prediction-gains", summary), "Pearson r of log PR vs layer (paper's recipe)")


@pytest.mark.parametrize("r,low,high,verdict", [
    (-0.99, -0.995, -0.985, AGREES),         # inside the paper's range
    (-0.983, -0.99, -0.983, AGREES),         # its weakest model, on the line
    (-0.95, -0.97, -0.93, WEAKER),           # a line still, short of the paper's
    (-0.917, -0.94, -0.89, WEAKER),          # the held-out one-hot r of SmolLM2 (issue #37) would be here
    (-0.6, -0.7, -0.5, CONTRADICTS),         # much weaker: no law
    (-0.22, -0.4, -0.05, CONTRADICTS),       # and −0.22 no longer shares a word with −0.92
    (0.3, 0.1, 0.5, CONTRADICTS),            # PR rising with depth
    (-0.985, -0.995, -0.97, UNDECIDED),      # straddles −0.983
    (-0.82, -0.86, -0.78, UNDECIDED),        # straddles the no-law cut
    (None, None, None, NOT_APPLICABLE),
])
def test_the_equi_learning_law_is_judged_on_the_papers_recipe(r, low, high, verdict):
    row = _law(r, low, high)
    assert row["verdict"] == verdict, row
    if r is not None:
        assert row["paper"] and row["method"] and "in-sample" in row["method"]


def test_the_no_law_cut_follows_from_the_papers_weakest_model():
    from studies.prediction_gains.declaration import NO_LAW, PAPER_WEAKEST

    # ten times the unexplained share of log PR's variance of the paper's weakest model
    assert 1 - NO_LAW ** 2 == pytest.approx(10 * (1 - PAPER_WEAKEST ** 2), abs=2e-3)
    assert _law(NO_LAW)["verdict"] == WEAKER and _law(NO_LAW + 0.001)["verdict"] == CONTRADICTS


def test_the_held_out_r_is_a_labelled_headline_not_judged_against_the_papers_range():
    from studies.prediction_gains.declaration import CLAIMS, HEADLINES, S
    from studies.reporting.headlines import headlines_for

    assert [c.key for c in CLAIMS] == [S.pearson_r_token_id]
    rows = headlines_for(_record("prediction-gains", {S.pearson_r: -0.917, S.pearson_r_token_id: -0.978}))
    held = [r for r in rows if "held-out" in r["label"]]
    assert len(held) == 1 and held[0]["value"] == -0.917 and "ours" in held[0]["label"]
    assert any("paper's recipe" in h.label for h in HEADLINES)


def test_a_drifting_in_sample_r_is_marked_unstable():
    stable = _law(-0.96, -0.98, -0.90, nested=[-0.95, -0.955, -0.96])
    drifting = _law(-0.96, -0.98, -0.90, nested=[-0.27, -0.89, -0.96])
    assert stable["unstable"] is False and drifting["unstable"] is True
    assert drifting["nested"] == [-0.27, -0.89, -0.96]


# ---------------------------------------------------------------------------- the paper's recipe, known answers
def test_in_sample_pr_is_least_squares_of_the_token_id():
    from probes.token_id_pr import _moments, in_sample_pr

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 7))
    t = rng.integers(0, 1000, 300).astype(float)
    A = np.c_[x, np.ones(len(x))]
    resid = t - A @ np.linalg.lstsq(A, t, rcond=None)[0]
    assert in_sample_pr(_moments(x, t)) == pytest.approx(resid @ resid / ((t - t.mean()) @ (t - t.mean())), rel=1e-9)
    with pytest.raises(ValueError, match="more than 8 tokens"):
        in_sample_pr(_moments(x[:8], t[:8]))


def _geometric_states(rho, n_layers=8, n_units=24, per_unit=250, d=6, pr0=0.8, seed=0):
    """States that encode the next id linearly, with noise set so that the population PR_l = pr0 · rho^l:
    one direction carries t plus noise of variance var(t)·PR/(1 − PR), the other d − 1 are pure noise."""
    rng = np.random.default_rng(seed)
    n = n_units * per_unit
    t = rng.integers(0, 5000, n)
    tc = (t - t.mean()) / t.std()
    X = np.empty((n_layers, n, d))
    for l in range(n_layers):
        pr = pr0 * rho ** l
        X[l, :, 0] = tc + rng.normal(0, math.sqrt(pr / (1 - pr)), n)
        X[l, :, 1:] = rng.normal(size=(n, d - 1))
    return X, t, np.repeat(np.arange(n_units), per_unit)


@pytest.mark.parametrize("rho", [0.7, 1.2])
def test_the_token_id_recipe_recovers_a_geometric_law(rho):
    """Noise decaying (ρ < 1: PR falls) or growing (ρ > 1, PR capped below 1) geometrically by layer: log PR is
    a line in l, r = ∓1, the decay ratio per layer is ρ, and the jackknife interval and nested fits hold it."""
    from probes.token_id_pr import TokenIdPR
    from studies.core.stability import nested_units

    pr0 = 0.8 if rho < 1 else 0.05
    X, t, units = _geometric_states(rho, pr0=pr0)
    res = TokenIdPR(norm=None).fit(X, t, units, nested_units(units)).result_
    expected = pr0 * rho ** np.arange(len(X))
    np.testing.assert_allclose(res.pr, expected, rtol=0.08)
    sign = -1 if rho < 1 else 1
    assert sign * res.summary.pearson_r > 0.998
    assert res.summary.decay_ratio == pytest.approx(rho, rel=0.02)
    lo, hi = res.pearson_interval
    assert lo <= res.summary.pearson_r <= hi and hi - lo < 0.01
    assert res.n_groups == 20 and res.nested_n[-1] == len(t) and res.nested_r[-1] == res.summary.pearson_r
    assert all(sign * v > 0.99 for v in res.nested_r)


def test_dropped_tokens_and_a_store_like_view_give_the_same_fit():
    from probes.token_id_pr import TokenIdPR

    X, t, units = _geometric_states(0.8, n_layers=3, n_units=6, per_unit=100)
    nxt = t.copy()
    nxt[::7] = -1                                 # no next token: dropped
    full = TokenIdPR(norm="rms").fit(X, nxt, units).result_
    keep = nxt >= 0
    direct = TokenIdPR(norm="rms").fit(X[:, keep], nxt[keep], units[keep]).result_
    np.testing.assert_allclose(full.pr, direct.pr, rtol=1e-10)
    assert full.n_tokens == int(keep.sum()) and full.n_groups == 6


# ---------------------------------------------------------------------------- context-memory
def _cm_row(measure_start, key, value, low=None, high=None, nested=None):
    from studies.context_memory.declaration import S

    summary = {getattr(S, key): value, getattr(S, f"{key}_low"): low, getattr(S, f"{key}_high"): high}
    if nested is not None:
        summary[f"nested__{getattr(S, key)}"] = nested
    return _row(_record("context-memory", summary), measure_start)


@pytest.mark.parametrize("margin,low,high,verdict", [
    (0.05, 0.02, 0.09, AGREES),           # a filler class holds the most memory over the identity baseline
    (-0.03, -0.08, -0.01, CONTRADICTS),   # another class (numbers) holds more
    (0.0, -0.01, 0.01, UNDECIDED),        # the interval straddles 0
    (-0.023, -0.109, 0.066, UNDECIDED),   # SmolLM2 on 4000 wiki-sample tokens, 7 held-out documents
    (None, None, None, NOT_APPLICABLE),
])
def test_the_filler_memory_claim_is_judged_on_the_identity_corrected_gain(margin, low, high, verdict):
    row = _cm_row("filler class with the most", "filler_margin_gain", margin, low, high)
    assert row["verdict"] == verdict, row
    assert "linear k-token probe, not the paper's decoder" in row["instrument"]
    assert "own input embedding" in row["method"] and "decoder" in row["paper"]


@pytest.mark.parametrize("rho,low,high,verdict", [
    (0.6, 0.55, 0.65, AGREES),            # strong, the paper's word
    (0.2, 0.1, 0.3, WEAKER),              # the paper's sign, not its strength
    (-0.2, -0.3, -0.1, CONTRADICTS),
    (0.5, 0.45, 0.55, UNDECIDED),         # straddles the strong cut
    (0.02, -0.05, 0.09, UNDECIDED),       # straddles 0
    (None, None, None, NOT_APPLICABLE),
])
def test_the_nonlinearity_claim_is_judged_on_the_identity_corrected_gain(rho, low, high, verdict):
    row = _cm_row("correlation of context memory", "corr_gain_nonlinearity", rho, low, high)
    assert row["verdict"] == verdict, row
    assert "linear k-token probe, not the paper's decoder" in row["instrument"]


def test_the_raw_ranking_is_no_longer_judged():
    from studies.context_memory.declaration import CLAIMS, S

    assert [c.key for c in CLAIMS] == [S.filler_margin_gain, S.corr_gain_nonlinearity]
    row = _cm_row("filler class with the most", "filler_margin_gain", 0.05, 0.02, 0.09, nested=[-0.2, 0.01, 0.05])
    assert row["unstable"] is True and row["nested"] == [-0.2, 0.01, 0.05]


def test_memory_gain_margin_and_correlation_known_answers():
    from studies.context_memory.study import bootstrap_units, filler_margin, gain_nonlinearity_corr, token_gain

    scores = np.array([[0.5, 0.2, np.nan, 0.9], [0.7, 0.4, 0.3, 0.9]])     # (layer, token)
    gain = token_gain(scores, [0.1, 0.1, 0.0, 0.85])
    np.testing.assert_allclose(gain, [0.5, 0.2, 0.3, 0.05])              # NaN layers left out of the mean
    classes = np.array(["punctuation", "content", "determiner", "number"])
    # best filler (punctuation 0.5) − best other (content 0.2): identity removed, "number" no longer tops
    assert filler_margin(gain, classes) == pytest.approx(0.3)
    assert filler_margin(gain[:1], classes[:1]) is None                  # no other class to beat
    assert filler_margin(gain, classes, weights=[0, 1, 0, 1]) is None     # a replicate without fillers
    nl = np.array([3.0, 1.0, 2.0, 0.5])
    assert gain_nonlinearity_corr(gain, nl) == pytest.approx(1.0)
    assert gain_nonlinearity_corr(gain, -nl) == pytest.approx(-1.0)
    # units resampled whole: a statistic that is the same in every unit has a zero-width interval
    units = np.repeat(np.arange(10), 5)
    (lo, hi), = bootstrap_units(units, 200, 0, lambda idx: 1.0)
    assert lo == hi == 1.0
    vals = np.repeat(np.arange(10, dtype=float), 5)
    (lo, hi), = bootstrap_units(units, 500, 0, lambda idx: float(vals[idx].mean()))
    assert lo < 4.5 < hi and hi - lo < 4
