"""The explorer's per-layer figures label their y axis wherever the values lie: on a log axis one tick per power
of ten is no label at all when a prediction residual runs from 0.6 to 0.95 (issue #38's unreadable figure)."""

from pathlib import Path

import numpy as np
import pytest

from app.explorer.ui import layer_figure, narrow_log_ticks
from studies.reporting.results import ResultRecord


@pytest.mark.parametrize("lo,hi", [(0.6, 0.95), (0.61, 0.62), (0.02, 0.9), (0.011, 0.099), (3.0, 250.0)])
def test_a_narrow_log_range_gets_at_least_two_labelled_ticks_inside_it(lo, hi):
    ticks = narrow_log_ticks(np.linspace(lo, hi, 30))
    assert len(ticks) >= 2 and all(lo - 1e-12 <= t <= hi + 1e-12 for t in ticks), ticks
    assert ticks == sorted(ticks) and len(set(ticks)) == len(ticks)


def test_a_wide_log_range_keeps_one_tick_per_power_of_ten():
    assert narrow_log_ticks([1e-3, 0.5, 2.0]) is None
    assert narrow_log_ticks([None, -1.0, float("nan")]) is None


def test_the_prediction_residual_figure_has_labelled_ticks():
    pr = list(np.geomspace(0.95, 0.6, 12))
    rec = ResultRecord(path=Path("."), study="prediction-gains", model="m", corpus="c", n_tokens=1, config={},
                       layers=list(range(12)), metrics={"pr": pr}, summary={})
    fig = layer_figure(rec, ["pr"], "Prediction residual per layer", log_y=True)
    y = fig.layout.yaxis
    assert y.type == "log" and len(y.tickvals) >= 2 and len(y.ticktext) == len(y.tickvals)
    assert all(0.6 <= v <= 0.95 for v in y.tickvals) and y.title.text
    assert fig.layout.xaxis.title.text
