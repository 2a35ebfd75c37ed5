import json
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import pytest

from studies.results import find_results, read_result, write_result


@dataclass(frozen=True)
class Cfg:
    alpha: float = 0.5
    name: str = "x"


def test_results_round_trip(tmp_path):
    fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[1.0, 2.0, 3.0]))
    write_result(tmp_path / "r", study="demo", model="tiny-llama", corpus="lee", n_tokens=10, config=Cfg(),
                 layers=[0, 1, 2], metrics={"m": [1.0, float("nan"), 3.0]}, summary={"s": np.float32(2.5)},
                 arrays={"a": np.arange(6).reshape(2, 3), "tok": np.array(["x", "y"])}, figures={"main": fig, "extra": fig})
    rec = read_result(tmp_path / "r")
    assert rec.study == "demo" and rec.layers == [0, 1, 2] and rec.config == {"alpha": 0.5, "name": "x"}
    assert rec.metrics["m"] == [1.0, None, 3.0] and rec.summary["s"] == 2.5
    assert np.isnan(rec.metric("m")[1])
    assert rec.arrays()["a"].shape == (2, 3) and list(rec.arrays()["tok"]) == ["x", "y"]
    assert set(rec.figure_paths) == {"main", "extra"} and set(rec.figures()) == {"main", "extra"}
    raw = json.loads((tmp_path / "r" / "result.json").read_text())
    assert {"versions", "git_revision", "created"} <= set(raw) and "torch" in raw["versions"]
    assert [r.study for r in find_results(tmp_path)] == ["demo"]


def test_metric_length_must_match_layers(tmp_path):
    with pytest.raises(ValueError, match="2 values for 3 layers"):
        write_result(tmp_path, study="d", model="m", corpus="c", n_tokens=1, layers=[0, 1, 2], metrics={"m": [1, 2]})


def test_object_arrays_are_refused(tmp_path):
    with pytest.raises(ValueError, match="object"):
        write_result(tmp_path, study="d", model="m", corpus="c", n_tokens=1, arrays={"o": np.array([{}, 1], dtype=object)})


def test_bootstrap_group_means_known_answers():
    import numpy as np

    from studies.stats import bootstrap_group_means

    # every group has the same mean: every resample gives it, whatever the counts
    lo, hi = bootstrap_group_means([2.0, 6.0, 10.0], [1, 3, 5], n_boot=50)
    assert lo == hi == 2.0
    # a ratio of sums, not a mean of means: the interval brackets Σ sums / Σ counts and stays in range
    sums, counts = np.array([[0.0, 10.0, 30.0, 4.0]]), np.array([[10.0, 10.0, 10.0, 2.0]])
    lo, hi = bootstrap_group_means(sums, counts, n_boot=400, seed=1)
    assert lo.shape == (1,) and 0.0 <= lo[0] <= sums.sum() / counts.sum() <= hi[0] <= 3.0
