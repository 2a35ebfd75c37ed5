"""Each headline to a declared precision (issue #38, studies.core.precision): every study declares the half-width
its headline is reported to and the sample-size curve that chose its default; the default is the curve's smallest
size (of enough units) that reached it; ``--precision`` sizes the sample and refuses what is not a precision;
result.json records the half-width reached beside the target; one knob name, the old ones read with a warning."""

from __future__ import annotations

import json
import warnings

import pytest

from app.commands.cli import main
from studies.core.config import config_from_dict
from studies.core.precision import (MIN_UNITS, RENAMED, SAMPLE_TOKENS, declared_precision, parse_targets,
                                    sample_for)
from studies.core.registry import STUDIES, get_study


# studies registered after issue #38 whose declaration does not yet say its precision (the lead empties this)
PENDING: set = set()


@pytest.mark.parametrize("name", [n for n in STUDIES if n not in PENDING])
def test_every_study_declares_its_precision_and_the_curve_that_chose_its_default(name):
    p = declared_precision(name)
    assert p is not None, f"{name}: declare PRECISION in its declaration.py (studies.core.precision)"
    assert p.half_width > 0 and p.unit and p.command
    config = get_study(name).config()
    assert getattr(config, p.knob) == p.default, f"{name}: the config's {p.knob} is not the declared default"
    rows = [r for r in p.curve if r[2] is not None]
    assert rows, f"{name}: no curve point with an interval"
    if len({r[0] for r in p.curve}) >= 4:  # a curve of 4-5 sizes chose the default: the smallest that reached it
        assert p.scales and p.min_sample >= MIN_UNITS
        assert p.chosen() == p.default, f"{name}: the curve gives {p.chosen()}, the default is {p.default}"
    else:  # a default kept as it was (its sample is the store's, or its cost is not the sample): the note says why
        assert p.note, f"{name}: a default not chosen by a curve says why in its note"
    at_default = [r for r in rows if r[0] == p.default]
    assert at_default and (at_default[0][3] - at_default[0][2]) / 2 <= p.half_width, \
        f"{name}: the default sample's interval is wider than the declared precision"


def test_the_sample_grows_as_the_interval_narrows():
    p = declared_precision("layer-ablation")
    assert sample_for(p, p.half_width) == p.default
    assert sample_for(p, p.half_width / 2) == 4 * p.default


@pytest.mark.parametrize("args,words", [
    (["layer-ablation", "--precision", "abc"], "expects a number"),
    (["layer-ablation", "--precision", "0"], "expects a half-width in"),
    (["layer-ablation", "--precision", "-0.01"], "expects a half-width in"),
    (["layer-ablation", "--precision", "5"], "expects a half-width in"),
    (["layer-ablation", "--precision", "nan"], "expects a half-width in"),
    (["prediction-gains", "--precision", "0.01"], "raise --max-tokens"),
    (["layer-ablation", "--precision", "logit-lens=0.1"], "not a study of this run"),
    (["all", "--precision", "0.01"], "NAME=HALF_WIDTH"),
    (["all", "--only", "layer-ablation", "--precision", "layer-ablation=x"], "expects a number"),
    (["layer-ablation", "--precision", "0.04", "--param", "eval_tokens=64"], "leave out --param"),
])
def test_a_precision_that_is_not_one_is_refused_in_one_line(tmp_path, capsys, args, words):
    rc = main(["study", *args, "--model", "tiny-llama", "--max-tokens", "200", "--quiet", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_parse_targets_per_study():
    assert parse_targets(["0.04"], ["layer-ablation"]) == {"layer-ablation": 0.04}
    assert parse_targets(["layer-ablation=0.04", "probes=0.01"], ["probes", "layer-ablation"]) == \
        {"layer-ablation": 0.04, "probes": 0.01}
    assert parse_targets([], ["probes"]) == {}


def test_the_result_records_the_precision_reached_and_its_target(tmp_path):
    out = tmp_path / "ab"
    p = declared_precision("layer-ablation")
    assert main(["study", "layer-ablation", "--model", "tiny-llama", "--max-tokens", "300", "--seq-len", "64",
                 "--param", "swap=false", "--precision", str(p.half_width / 2), "--quiet", "--out", str(out)]) == 0
    record = json.loads((out / "result.json").read_text())
    got = record["extra"]["precision"]
    assert got["target"] == p.half_width / 2 and got["requested"] is True and got["knob"] == SAMPLE_TOKENS
    assert got["sample"] == record["config"][SAMPLE_TOKENS] == 4 * p.default
    assert record["config"]["target_half_width"] == p.half_width / 2
    assert set(got) >= {"headline", "half_width", "reached", "value"}


def test_the_old_names_of_the_sample_knob_are_read_with_a_warning():
    from studies.logit_lens.study import Config

    assert set(RENAMED.values()) == {SAMPLE_TOKENS}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = config_from_dict(Config, {"lens_tokens": "100"})
    assert config.sample_tokens == 100
    assert any("now called sample_tokens" in str(w.message) for w in caught)
    with pytest.raises(Exception, match="old name"):
        config_from_dict(Config, {"lens_tokens": "100", "sample_tokens": "200"})


@pytest.mark.slow
def test_the_default_sample_reaches_the_declared_precision_on_a_real_model(tmp_path):
    """SmolLM2-135M on a small store (4000 tokens, not the curves' 20000): the studies sized by sample_tokens that are
    cheap enough for the suite reach their declared half-width at their default sample — a size that reached it on
    the curve's store but not here is a Precision's ``missed`` (docs/sample_sizes.md has the curves)."""
    store = tmp_path / "store"
    for name in ("probes", "layer-ablation", "anisotropy"):
        out = tmp_path / name
        assert main(["study", name, "--model", "smollm2-135m", "--corpus", "wiki-sample", "--max-tokens", "4000",
                     "--store", str(store), "--quiet", "--out", str(out)]) == 0
        got = json.loads((out / "result.json").read_text())["extra"]["precision"]
        assert got["sample"] == declared_precision(name).default
        assert got["reached"] is True, got


def test_the_report_shows_the_precision_reached_beside_its_target(tmp_path):
    from studies.reporting.report import build_report
    from studies.reporting.results import write_result

    extra = {"precision": {"headline": "retained accuracy", "half_width": 0.031, "target": 0.05, "requested": False,
                           "knob": SAMPLE_TOKENS, "sample": 1280, "reached": True}}
    write_result(tmp_path / "layer-ablation", study="layer-ablation", model="m", corpus="c", n_tokens=10, extra=extra)
    html = build_report(tmp_path).read_text()
    assert "<h2>Precision</h2>" in html and "±0.031" in html and "±0.05" in html and "reached" in html
