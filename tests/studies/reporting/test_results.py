import json
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import pytest

from studies.reporting.results import find_results, read_result, write_result


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

    from studies.core.stats import bootstrap_group_means

    # every group has the same mean: every resample gives it, whatever the counts
    lo, hi = bootstrap_group_means([2.0, 6.0, 10.0], [1, 3, 5], n_boot=50)
    assert lo == hi == 2.0
    # a ratio of sums, not a mean of means: the interval brackets Σ sums / Σ counts and stays in range
    sums, counts = np.array([[0.0, 10.0, 30.0, 4.0]]), np.array([[10.0, 10.0, 10.0, 2.0]])
    lo, hi = bootstrap_group_means(sums, counts, n_boot=400, seed=1)
    assert lo.shape == (1,) and 0.0 <= lo[0] <= sums.sum() / counts.sum() <= hi[0] <= 3.0


def _demo(path, **kw):
    args = dict(study="demo", model="tiny-llama", corpus="lee", n_tokens=10, layers=[0, 1],
                metrics={"m": [1.0, 2.0]}, summary={"s": 1.0}, arrays={"a": np.arange(4.0)})
    write_result(path, **{**args, **kw})
    return path


@pytest.mark.parametrize("field,value,why", [
    ("layers", None, "layers must be a list of layer numbers"),
    ("layers", [0, "1"], "layers must be a list of layer numbers"),
    ("metrics", {"m": "n/a"}, "metric 'm' must hold one value per layer (2), got str"),
    ("metrics", {"m": [1.0]}, "metric 'm' must hold one value per layer (2), got 1 values"),
    ("summary", [1, 2], "summary must be a JSON object, got list"),
    ("study", 7, "study must be a string, got int"),
    ("n_tokens", "many", "n_tokens must be a whole number"),
])
def test_a_record_of_another_shape_is_refused_and_skipped_with_its_reason(tmp_path, field, value, why):
    from lens.errors import LensInputError

    good, bad = _demo(tmp_path / "good"), _demo(tmp_path / "bad")
    raw = json.loads((bad / "result.json").read_text())
    raw[field] = value
    (bad / "result.json").write_text(json.dumps(raw))
    with pytest.raises(LensInputError, match="is not a result record as a study writes it: " + why.replace("(", r"\(").replace(")", r"\)")):
        read_result(bad)
    skipped = []
    assert [r.path for r in find_results(tmp_path, skipped)] == [good]
    assert [folder for folder, _ in skipped] == [bad] and why in skipped[0][1]


@pytest.mark.parametrize("content,why", [
    (b"\x00\x01garbage", "not an .npz archive"),
    (b"\x93NUMPY\x01\x00", "not an .npz archive"),  # a bare .npy under the name
    (None, "File is not a zip file"),  # the real archive cut short
])
def test_a_damaged_arrays_file_names_itself(tmp_path, content, why):
    from lens.errors import LensInputError

    rec = read_result(_demo(tmp_path / "r"))
    path = tmp_path / "r" / "arrays.npz"
    path.write_bytes(content if content is not None else path.read_bytes()[:60])
    with pytest.raises(LensInputError, match=f"arrays.npz is damaged and cannot be read \\({why}\\)"):
        rec.arrays()


def test_an_object_array_is_never_unpickled(tmp_path):
    from lens.errors import LensInputError

    rec = read_result(_demo(tmp_path / "r"))
    np.savez(tmp_path / "r" / "arrays.npz", o=np.array([{}, 1], dtype=object))  # allow_pickle defaults to True on save
    with pytest.raises(LensInputError, match="an object array, which is never unpickled"):
        rec.arrays()


def test_the_report_lists_what_it_left_out(tmp_path):
    from studies.reporting.report import build_report

    _demo(tmp_path / "good")
    bad = _demo(tmp_path / "bad")
    (bad / "result.json").write_text('{"study": "demo", "layers": [0')
    html = build_report(tmp_path).read_text()
    assert "1 results folder(s) left out" in html and "<code>bad</code>: bad/result.json is not valid JSON" in html
