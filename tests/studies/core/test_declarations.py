"""The studies' plain-data declarations: every metric has a human label and a unit, every result a typed
layer axis, every seed claim one rule whose verdicts fall on the paper's threshold, and reading them (the
explorer's data layer) imports neither torch nor a study's compute code."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from studies.core.contract import (AGREES, CONTRADICTS, NOT_APPLICABLE, VERDICTS, WEAKER, AxisKind, LayerAxis, ResultSpec,
                              Rule)
from studies.core.registry import STUDIES, declaration, get_study

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_metric_has_a_label_and_a_unit(name):
    spec = declaration(name).result
    for f in spec.metrics:
        assert f.title and f.unit, f"{name}: metric {f.name!r} needs title= and unit= in its declaration"
        assert f.title != f.name, f"{name}: {f.name!r}'s title repeats its key"
    for f in spec.per_token():  # what the Token view colours tokens by
        assert f.title and f.unit, f"{name}: per-token array {f.name!r} needs title= and unit="
    for f in spec.summary:
        assert f.title, f"{name}: summary value {f.name!r} needs title="
    for f in [*spec.metrics, *spec.summary]:  # a family's title names its parts where its name does
        if f.is_family:
            assert f.title.count("{}") <= f.name.count("{}"), f.name


def test_labels_fill_a_family_and_fall_back_to_the_key():
    spec = declaration("linearity").result
    assert spec.label("nonlinearity__punctuation") == "nonlinearity, punctuation tokens (residual norm (0–1))"
    assert spec.label("nonlinearity__punctuation", unit=False) == "nonlinearity, punctuation tokens"
    assert spec.label("not_declared") == "not_declared" and spec.unit("not_declared") == ""
    pg = declaration("prediction-gains").result
    assert pg.label("pr_in_sample", unit=False) == "prediction residual PR (in-sample)"
    assert pg.unit("pr_in_sample")


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_result_has_a_typed_layer_axis(name):
    axis = declaration(name).result.layer_axis
    assert isinstance(axis, LayerAxis) and isinstance(axis.kind, AxisKind) and axis.title
    spec = declaration(name).result
    if axis.kind is AxisKind.NONE:
        assert not len(spec.metrics), f"{name} declares per-layer metrics on no layer axis"


def test_layer_axis_kinds_and_ticks():
    assert declaration("linearity").result.layer_axis.kind is AxisKind.TRANSITION
    assert declaration("linearity").result.layer_axis.tick(3) == "3→4"
    assert declaration("layer-ablation").result.layer_axis.kind is AxisKind.ABLATED
    assert declaration("filler-tokens").result.layer_axis.kind is AxisKind.NONE
    assert declaration("logit-lens").result.layer_axis.title == "layer (output of block l, resid_post)"
    # a description in words (a study written before the axis was typed) becomes a typed axis
    assert ResultSpec(layer_axis="transition l → l+1 of resid_mid").layer_axis == LayerAxis(AxisKind.TRANSITION,
                                                                                           "resid_mid")
    assert ResultSpec(layer_axis="none (no per-layer metrics)").layer_axis.kind is AxisKind.NONE


@pytest.mark.parametrize("name", list(STUDIES))
def test_the_declaration_is_what_the_study_uses(name):
    study, found = get_study(name), declaration(name)
    assert study.result is found.result and study.headlines == found.headlines and study.claims == found.claims
    assert found.claims, f"{name} declares no judged claim"
    for c in found.claims:
        assert c.rule.text and c.claim and c.source and c.measure


# ------------------------------------------------------------------------ verdict rules
def test_a_numeric_rule_on_each_side_of_its_thresholds():
    rule = Rule("agrees ≥ 0.72; weaker in [0.5, 0.72)", agrees=(0.72, None), weaker=((0.5, 0.72),))
    assert rule.verdict(0.72) == AGREES and rule.verdict(0.95) == AGREES
    assert rule.verdict(0.7199) == WEAKER and rule.verdict(0.5) == WEAKER
    assert rule.verdict(0.4999) == CONTRADICTS and rule.verdict(0.024) == CONTRADICTS
    for missing in (None, math.nan, math.inf, "text", True):
        assert rule.verdict(missing) == NOT_APPLICABLE


def test_a_text_rule():
    rule = Rule("fillers", agrees_in=frozenset({"punctuation", "determiner"}), weaker_in=frozenset({"stopword"}))
    assert rule.verdict("punctuation") == AGREES and rule.verdict("stopword") == WEAKER
    assert rule.verdict("content") == CONTRADICTS and rule.verdict(0.5) == NOT_APPLICABLE


def _record(study, summary=None, metrics=None, layers=None):
    from studies.reporting.results import ResultRecord

    metrics = metrics or {}
    n = len(next(iter(metrics.values()))) if metrics else 0
    return ResultRecord(path=Path("."), study=study, model="m", corpus="c", n_tokens=1, config={},
                        layers=layers or list(range(n)), metrics=metrics, summary=summary or {})


def _verdict(record, measure_start=""):
    from studies.reporting.headlines import judged

    rows = [r for r in judged(record) if r["measure"].startswith(measure_start)]
    assert rows, [r["measure"] for r in judged(record)]
    return rows[0]["verdict"]


@pytest.mark.parametrize("r,verdict", [(-0.997, AGREES), (-0.983, AGREES), (-0.982, WEAKER), (-0.917, WEAKER),
                                       (0.05, CONTRADICTS), (None, NOT_APPLICABLE)])
def test_the_equi_learning_law_claim(r, verdict):
    assert _verdict(_record("prediction-gains", {"pearson_r_token_id": r})) == verdict


def test_the_equi_learning_law_row_carries_its_interval():
    from studies.reporting.headlines import judged

    row = judged(_record("prediction-gains", {"pearson_r_token_id": -0.99, "pearson_r_token_id_low": -0.995,
                                              "pearson_r_token_id_high": -0.985}))[0]
    assert (row["low"], row["high"], row["interval"]) == (-0.995, -0.985, "[-0.995, -0.985]")


@pytest.mark.parametrize("kept,verdict", [(0.72, AGREES), (0.9, AGREES), (0.6, WEAKER), (0.024, CONTRADICTS)])
def test_the_layer_deletion_claim(kept, verdict):
    assert _verdict(_record("layer-ablation", {"retained_mean_inner_delete": kept})) == verdict


@pytest.mark.parametrize("value,verdict", [(3.0, AGREES), (0.0, AGREES), (-0.5, CONTRADICTS), (None, NOT_APPLICABLE)])
def test_the_intrinsic_dimension_hunchback_claim(value, verdict):
    # sequence-level ID at the interior peak − max(first, last): tests/studies/per_study/test_verdicts_intrinsic_dim.py
    summary = {"seq_hunchback": value, "seq_n_sequences": 500} if value is not None else {}
    assert _verdict(_record("intrinsic-dim", summary)) == verdict


@pytest.mark.parametrize("filler,random,verdict", [(0.4, 0.2, AGREES), (0.1, 0.3, AGREES),
                                                   (-0.1, 0.2, CONTRADICTS), (0.0, 0.2, CONTRADICTS)])
def test_the_filler_removal_claim(filler, random, verdict):  # judged against the intact input; random is ours
    record = _record("filler-tokens", {"delta_ctx_filler": filler, "delta_ctx_random": random})
    assert _verdict(record) == verdict


@pytest.mark.parametrize("score,verdict", [(0.99, AGREES), (0.98, AGREES), (0.95, WEAKER), (0.5, CONTRADICTS)])
def test_the_secretly_linear_claim(score, verdict):
    assert _verdict(_record("linearity", {"linearity_mean": score})) == verdict


@pytest.mark.parametrize("margin,verdict", [(0.05, AGREES), (-0.03, CONTRADICTS)])
def test_the_filler_memory_claim(margin, verdict):
    assert _verdict(_record("context-memory", {"filler_margin_gain": margin}), "filler class with") == verdict


@pytest.mark.parametrize("moved,verdict", [(0.9, AGREES), (0.7, AGREES), (0.5, WEAKER), (0.0, CONTRADICTS)])
def test_the_context_knob_claim(moved, verdict):
    assert _verdict(_record("context-knob", {"steer_moved_share": moved})) == verdict


@pytest.mark.parametrize("ce,verdict", [([9, 8.5, 8, 3, 1], AGREES), ([9, 4, 2, 1.5, 1], WEAKER),
                                        ([9, 1, 1, 1, 1], CONTRADICTS), ([1, 2, 3, 4, 5], CONTRADICTS)])
def test_the_late_sharpening_claim(ce, verdict):
    record = _record("logit-lens", {"uniform_ce": 10.8}, metrics={"ce": ce})  # ln V: the lens beats uniform
    assert _verdict(record, "share of the CE drop") == verdict


@pytest.mark.parametrize("ce,share", [([9, 8.5, 8, 3, 1], 7 / 8), ([4, 9, 8, 3, 1], 7 / 8), ([4, 6, 9, 3, 1], 1.0),
                                      ([9, 1, 1, 1, 1], 0.0), ([9, 4, 2, 1.5, 3], 0.0), ([1, 2, 3, 4, 5], 0.0)])
def test_the_late_share_stays_a_share_when_the_curve_first_rises(ce, share):
    """The fall is measured from the highest value at or before mid depth: a cross-entropy that first rises
    (as SmolLM2's does) gave 1.58 "of the drop" when measured from layer 0."""
    from studies.reporting.headlines import drop_share_after_mid

    assert drop_share_after_mid("ce")(_record("logit-lens", metrics={"ce": ce})) == pytest.approx(share)


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_claim_of_every_study_gives_a_verdict_on_an_empty_record(name):
    from studies.reporting.headlines import judged

    rows = judged(_record(name))
    assert rows and all(r["verdict"] in VERDICTS for r in rows)
    assert all(r["verdict"] == NOT_APPLICABLE for r in rows)  # nothing measured: nothing judged


# ------------------------------------------------------------------------ cheap to import
def test_the_explorers_data_layer_imports_no_torch_and_no_compute_code():
    code = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
import app.explorer.data, app.explorer.grid, app.explorer.links
from studies.core.registry import STUDIES, declaration
specs = [declaration(n).result for n in STUDIES]
from studies.reporting.headlines import judged
compute = sorted(m for m in sys.modules if m in {{v[0] for v in STUDIES.values()}})
print(json.dumps({{"torch": "torch" in sys.modules, "compute": compute, "n": len(specs)}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"torch": False, "compute": [], "n": len(STUDIES)}


def test_the_report_judges_each_claim_and_links_it_to_its_figure(tmp_path):
    import re

    from tests.synthetic_runs import write_synthetic_run
    from studies.reporting.report import build_report

    write_synthetic_run(tmp_path / "run", n_layers=6, n_tokens=120)
    page = build_report(tmp_path).read_text(encoding="utf-8")
    table = page[page.index("<h2>Judged findings</h2>"):page.index("<h2>Headline numbers</h2>")]
    verdicts = re.findall(r"<td class='(agrees|weaker|contradicts|not-applicable)'>", table)
    assert len(verdicts) == sum(len(declaration(n).claims) for n in STUDIES)
    assert "weaker" in verdicts  # the synthetic linearity (0.958) is short of "≈ 0.99"
    links = re.findall(r"<a href='#([^']+)'>figure</a>", table)
    assert len(links) == len(verdicts) and all(f"id='{anchor}'" in page for anchor in links), links
    assert "run-logit-lens--metrics" in links  # a figure the result saved: its own anchor
    assert "[-0.995" not in table  # no interval invented where the result has none
