"""Verdicts with four words and the stability / null records (studies.core.contract.Rule, studies.core.stability)."""

import numpy as np
import pytest

from studies.core import stability
from studies.core.contract import AGREES, CONTRADICTS, NOT_APPLICABLE, UNDECIDED, WEAKER, Rule

RULE = Rule("agrees ≥ 0.72; weaker in [0.5, 0.72); else contradicts", agrees=(0.72, None), weaker=((0.5, 0.72),))


@pytest.mark.parametrize("value, low, high, want", [
    (0.80, 0.75, 0.85, AGREES),        # the whole interval above the paper's threshold
    (0.80, None, None, AGREES),        # no interval: the point decides
    (0.60, 0.55, 0.65, WEAKER),
    (0.30, 0.20, 0.40, CONTRADICTS),
    (0.74, 0.70, 0.78, UNDECIDED),     # straddles 0.72
    (0.52, 0.45, 0.58, UNDECIDED),     # straddles 0.5
    (0.60, 0.40, 0.90, UNDECIDED),     # holds the whole weaker band
    (None, 0.1, 0.2, NOT_APPLICABLE),
    (float("nan"), 0.1, 0.2, NOT_APPLICABLE),
])
def test_a_verdict_is_undecided_when_the_interval_straddles_a_threshold(value, low, high, want):
    assert RULE.verdict(value, low, high) == want


def test_a_bounded_agree_band_inside_the_interval_is_undecided():
    rule = Rule("agrees in [-0.997, -0.983]", agrees=(-0.997, -0.983), weaker=((-0.983, -0.9),))
    assert rule.verdict(-0.99, -0.995, -0.985) == AGREES
    assert rule.verdict(-0.95, -1.0, -0.9) == UNDECIDED  # both ends outside the band, the band inside
    assert rule.thresholds() == [-0.997, -0.983, -0.9]


def test_text_values_ignore_intervals():
    rule = Rule("agrees for fillers", agrees_in=frozenset({"punctuation"}))
    assert rule.verdict("punctuation", 0.1, 0.2) == AGREES
    assert rule.verdict("content", None, None) == CONTRADICTS


def test_nested_units_are_nested_seeded_and_keep_units_whole():
    units = np.repeat(np.arange(40), 5)
    masks = stability.nested_units(units, seed=3)
    assert [m.sum() for m in masks] == [50, 100, 200]
    assert np.all(masks[0] <= masks[1]) and np.all(masks[1] <= masks[2])
    for m in masks:  # a unit is in or out whole
        assert all(len(set(m[units == u])) == 1 for u in range(40))
    again = stability.nested_units(units, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(masks, again))
    assert not np.array_equal(stability.nested_units(units, seed=4)[0], masks[0])


def test_nested_values_of_a_mean_and_the_stability_mark():
    rng = np.random.default_rng(0)
    units = np.repeat(np.arange(200), 10)
    x = rng.normal(size=units.size)
    values, sizes = stability.nested_values(lambda m: x[m].mean(), units)
    assert sizes == [500, 1000, 2000]
    se = x.std() / np.sqrt(x.size)
    low, high = values[-1] - 1.96 * se, values[-1] + 1.96 * se
    assert stability.is_unstable(values, low, high) is False  # noise alone stays within the interval
    drift = [0.5, 0.2, 0.0]  # an in-sample fit still moving with n
    assert stability.is_unstable(drift, -0.05, 0.05) is True
    assert stability.is_unstable(drift, None, None) is None
    rec = stability.record("r", values, sizes)
    assert rec["nested__r"][-1] == pytest.approx(values[-1], abs=1e-6) and rec["nested_n__r"] == sizes


def test_add_one_p_is_never_zero_and_exact_under_the_null():
    assert stability.add_one_p(10.0, [0.0] * 99) == pytest.approx(0.01)
    assert stability.add_one_p(-1.0, [0.0] * 99) == 1.0
    assert stability.add_one_p(-1.0, [0.0] * 99, greater=False) == pytest.approx(0.01)
    rng = np.random.default_rng(1)  # under the null, p <= 0.05 about 5% of the time
    ps = [stability.add_one_p(rng.normal(), rng.normal(size=99)) for _ in range(2000)]
    assert 0.03 < np.mean(np.asarray(ps) <= 0.05) < 0.07
    with pytest.raises(ValueError):
        stability.add_one_p(1.0, [float("nan")])
