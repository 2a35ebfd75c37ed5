"""The intrinsic-dimension hunchback claim (Cheng et al. 2025; Valeriani et al. 2023), judged on the
sequence-level cloud: ID(interior peak) − max(ID first, ID last) with its 95% interval; synthetic records on
each side of 0 and one straddling it, read back through studies.reporting.headlines.judged, and the synthetic known
answer of the statistic itself (a cloud whose ID rises then falls across layers, and a monotone one)."""


import numpy as np
import pytest

from geometry.id_hunchback import hunchback, hunchback_statistic
from studies.core.contract import AGREES, CONTRADICTS, NOT_APPLICABLE, UNDECIDED
from studies.intrinsic_dim.declaration import MIN_SEQUENCES
from studies.reporting.headlines import verdict_text


from tests.geometry.layer_clouds import drifting_layers
from tests.studies.verdict_records import judged_row, record


def _record(summary, metrics=None):
    return record("intrinsic-dim", summary, metrics)


def _row(rec):
    return judged_row(rec, "sequence-level ID")


def _summary(value, low, high, n=500, **more):
    return {"seq_hunchback": value, "seq_hunchback_low": low, "seq_hunchback_high": high, "seq_n_sequences": n,
            **more}


@pytest.mark.parametrize("value,low,high,verdict", [
    (4.0, 2.5, 5.5, AGREES),          # the whole interval above 0: an interior peak beats both ends
    (0.4, 0.05, 0.9, AGREES),         # just above
    (0.6, -0.3, 1.4, UNDECIDED),      # straddles 0
    (-0.1, -0.8, 0.5, UNDECIDED),
    (-0.5, -0.9, -0.1, CONTRADICTS),  # just below: an end is at least as high as every interior layer
    (-3.0, -4.0, -2.0, CONTRADICTS),
])
def test_the_hunchback_verdict_on_each_side_of_zero(value, low, high, verdict):
    row = _row(_record(_summary(value, low, high)))
    assert row["verdict"] == verdict
    assert "Cheng" in row["source"] and "Valeriani" in row["source"]
    assert "one point per sequence" in row["paper"].lower()
    assert row["instrument"]  # TwoNN, not GRIDE: said with the verdict


@pytest.mark.parametrize("summary,why", [
    ({}, "no sequence-level cloud"),
    (_summary(4.0, 2.5, 5.5, n=MIN_SEQUENCES - 1), f"only {MIN_SEQUENCES - 1} sequences"),
])
def test_too_few_sequences_or_none_is_not_applicable(summary, why):
    row = _row(_record(summary))
    assert row["verdict"] == NOT_APPLICABLE and why in row["reason"]


def test_the_old_all_token_argmax_is_no_longer_judged():
    """The all-token TwoNN profile is a headline of ours, not a claim: a record with only it is not judged."""
    twonn = [1.0] * 11
    twonn[5] = 9.0
    row = _row(_record({}, metrics={"twonn": twonn}))
    assert row["verdict"] == NOT_APPLICABLE


def test_nested_values_and_the_null_are_read_back_with_the_verdict():
    summary = _summary(3.0, 1.0, 5.0, nested__seq_hunchback=[9.5, 3.2, 3.0], nested_n__seq_hunchback=[10, 20, 40],
                       null__seq_hunchback=-0.4, null_p__seq_hunchback=0.01)
    row = _row(_record(summary))
    assert row["verdict"] == AGREES and row["nested"] == [9.5, 3.2, 3.0]
    assert row["unstable"] is True  # N/4 moved by 6.5, more than the interval's width 4
    assert row["null_p"] == 0.01 and "null p = 0.010" in verdict_text(row) and "unstable" in verdict_text(row)


# ---------------------------------------------------------------------------- the statistic's known answer
def _layers(dims, n=500, D=48, seed=0, drift=0.5):
    return drifting_layers(dims, n, np.random.default_rng(seed), D, drift)


def test_statistic_on_a_profile():
    assert hunchback_statistic([2, 5, 9, 4, 3]) == (6.0, 2)
    assert hunchback_statistic([2, 3, 4, 5, 6]) == (-1.0, 3)  # monotone: the last layer is the highest
    with pytest.raises(ValueError, match="at least 3 layers"):
        hunchback_statistic([1, 2])


@pytest.mark.parametrize("dims,verdict", [
    ((3, 6, 10, 6, 4), AGREES),         # rises then falls: an interior peak well above both ends
    ((2, 4, 7, 10, 14), CONTRADICTS),   # monotone rising: the last layer is the highest
    ((14, 10, 7, 4, 2), CONTRADICTS),   # monotone falling: the first layer is the highest
])
def test_a_cloud_whose_id_rises_then_falls_agrees_and_a_monotone_one_contradicts(dims, verdict):
    hb = hunchback(_layers(dims), n_boot=300, seed=1)
    assert np.allclose(hb.profile, dims, rtol=0.25)  # TwoNN recovers each layer's dimension
    row = _row(_record(_summary(hb.statistic, hb.statistic_low, hb.statistic_high, n=hb.n_points)))
    assert row["verdict"] == verdict
    assert hb.statistic_low <= hb.statistic <= hb.statistic_high


def test_a_flat_profile_is_undecided_not_a_hunchback():
    """Every layer of the same dimension: the interior peak is noise, and its interval holds 0 (the peak is
    chosen on the sample, so a flat profile is sometimes judged a hunchback; rarely, not as a rule)."""
    verdicts = []
    for seed in range(10):
        hb = hunchback(_layers((6, 6, 6, 6, 6), n=300, seed=100 + seed), n_boot=300, seed=seed)
        verdicts.append(_row(_record(_summary(hb.statistic, hb.statistic_low, hb.statistic_high,
                                              n=hb.n_points)))["verdict"])
    assert verdicts.count(UNDECIDED) >= 8, verdicts


def test_the_bootstrap_keeps_units_whole_and_a_clustered_sample_is_wider():
    """Documents as units: resampling 50 documents of 10 sequences each gives wider intervals than treating
    the 500 sequences as independent when sequences of one document sit close together."""
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(50, 8)) * 3
    base = np.repeat(centres, 10, axis=0) + rng.normal(size=(500, 8)) * 0.3
    mats = [base @ np.linalg.qr(rng.normal(size=(32, 8)))[0].T * s for s in (1.0, 1.5, 1.2)]
    docs = np.repeat(np.arange(50), 10)
    by_doc = hunchback(mats, docs, n_boot=300, seed=0)
    by_point = hunchback(mats, None, n_boot=300, seed=0)
    assert by_doc.n_units == 50 and by_point.n_units == 500
    assert by_doc.raw == by_point.raw  # the full profile does not depend on the units
    assert np.all(by_doc.high - by_doc.low > 1.2 * (by_point.high - by_point.low))
    with pytest.raises(ValueError, match="one unit per point"):
        hunchback(mats, docs[:10], n_boot=10)


# ---------------------------------------------------------------------------- one point per window
class _FakeView:
    def __init__(self, states, rows=None):
        self.states, self.rows = states, rows

    def astype(self, dtype):
        return _FakeView([s.to(dtype) for s in self.states], self.rows)

    def take(self, rows):
        return _FakeView(self.states, np.asarray(rows))

    def __iter__(self):
        import torch

        return iter([s[torch.as_tensor(self.rows)] for s in self.states])


class _FakeStore:
    """Three windows (doc, window): (0, 0) of 5 kept tokens, (0, 1) of 2, (1, 0) of 4; row 0 is a BOS."""

    def __init__(self):
        import torch

        self.tokens = {"doc": np.array([0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]),
                       "window": np.array([0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0]),
                       "pos": np.array([0, 1, 2, 3, 4, 5, 0, 1, 0, 1, 2, 3])}
        self.keep = np.array([False] + [True] * 11)
        self.states = [torch.arange(12, dtype=torch.float64)[:, None] * torch.ones(1, 3) * (l + 1) for l in range(2)]

    def mask(self, drop_special, min_pos):
        return self.keep

    def view(self, site):
        return _FakeView(self.states)


def test_one_point_per_window_last_token_or_mean():
    from studies.intrinsic_dim import study as intrinsic_dim

    store = _FakeStore()
    wins = intrinsic_dim.sequence_windows(store.tokens, store.keep, min_tokens=3, max_sequences=0)
    assert [w.tolist() for w in wins] == [[1, 2, 3, 4, 5], [8, 9, 10, 11]]  # the 2-token window is left out
    assert len(intrinsic_dim.sequence_windows(store.tokens, store.keep, 1, max_sequences=2, seed=0)) == 2
    cfg = intrinsic_dim.Config(seq_len=8, min_sequence_tokens=3, max_sequences=0)
    mats, rows, lengths = intrinsic_dim.sequence_cloud(store, cfg, "last")
    assert rows.tolist() == [5, 11] and lengths.tolist() == [5, 4]
    assert mats[1][:, 0].tolist() == [10.0, 22.0]  # layer 1 holds 2 × row
    mats, _, _ = intrinsic_dim.sequence_cloud(store, cfg, "mean")
    assert mats[0][:, 0].tolist() == [3.0, 9.5]  # mean of rows 1..5 and of rows 8..11


def test_a_bad_pooling_is_refused_before_anything_runs():
    from lens.errors import LensInputError
    from studies.intrinsic_dim import study as intrinsic_dim

    with pytest.raises(LensInputError, match="pooling: expected one of auto, last, mean, got 'max'"):
        intrinsic_dim.check(intrinsic_dim.Config(pooling="max"))
    intrinsic_dim.check(intrinsic_dim.Config())


def test_cross_fitting_removes_the_optimism_of_a_peak_chosen_on_the_sample():
    """30 layers of one dimension: the highest interior layer, read on the sample it was chosen on, rises above
    the ends by noise alone (raw > 0 on average); chosen on half the units and read on the other, it does not."""
    raw, fitted = [], []
    for seed in range(8):
        hb = hunchback(_layers((6,) * 30, n=200, D=24, seed=300 + seed, drift=1.0), n_boot=0, seed=seed)
        raw.append(hb.raw)
        fitted.append(hb.statistic)
        assert np.isnan(hb.statistic_low) and hb.replicates.size == 0  # n_boot=0: no interval
    assert np.mean(raw) > 0.5 and np.mean(np.array(raw) > 0) >= 0.75, raw
    # at most 0 on average (the higher of two noisy ends is itself a little optimistic, so a little below)
    assert np.mean(fitted) < 0.25 and np.mean(raw) - np.mean(fitted) > 0.5, (fitted, raw)
