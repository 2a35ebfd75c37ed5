"""A result's layer axis is read at the site the run read (issue #41: a run on ``resid_mid`` was drawn under the
declaration's literal "resid_post" axis): written in result.json beside ``layers``, read back by the explorer and
the report, and an old result without it reads as the declared axis."""

import json

from app.explorer.ui import axis_title, layer_figure
from studies.anisotropy import study as anisotropy
from studies.core.contract import AxisKind, LayerAxis
from studies.core.runner import run_study
from studies.reporting.report import _axis_title
from studies.reporting.results import read_result

BASE = dict(model="tiny-llama", corpus="wiki-sample", max_tokens=256, seq_len=64, progress=False)


def _x_titles(fig_json: dict) -> set:
    layout = fig_json["layout"]
    return {v.get("title", {}).get("text", "") for k, v in layout.items() if k.startswith("xaxis")}


def test_a_geometry_run_on_resid_mid_records_and_draws_a_resid_mid_axis(tmp_path):
    cfg = anisotropy.Config(**BASE, site="resid_mid", postprocessing=("standardize",), min_count=2,
                            store=str(tmp_path / "store"))
    out = run_study("anisotropy", cfg, tmp_path / "an")
    written = json.loads((out / "result.json").read_text())
    assert written["layer_axis"] == {"kind": "block", "site": "resid_mid", "note": ""}
    rec = read_result(out)
    assert rec.layer_axis == LayerAxis(AxisKind.BLOCK, "resid_mid")
    # the study's own figure (saved, what the report shows), the explorer's figure and the report's line
    titles = _x_titles(json.loads((out / "figures" / "main.json").read_text()))
    assert titles and all("resid_mid" in t and "resid_post" not in t and "after attention" in t for t in titles)
    for text in (layer_figure(rec, ["mean_cosine"], "t").layout.xaxis.title.text, axis_title(rec.study, rec),
                 _axis_title(rec)):
        assert "resid_mid" in text and "resid_post" not in text, text

    # an old result.json without the field still reads, under the declared axis
    del written["layer_axis"]
    (out / "result.json").write_text(json.dumps(written))
    old = read_result(out)
    assert old.layer_axis is None
    declared = "layer (output of block l, resid_post)"
    assert axis_title(old.study, old) == declared == _axis_title(old)
    assert layer_figure(old, ["mean_cosine"], "t").layout.xaxis.title.text == declared


def test_the_axis_round_trips_and_a_malformed_one_reads_as_absent():
    axis = LayerAxis(AxisKind.TRANSITION, "mlp_out", "a note")
    assert LayerAxis.from_dict(axis.to_dict()) == axis
    assert "mlp_out" in axis.title and "a note" in axis.title
    for bad in (None, "resid_mid", {"kind": "sideways"}, {"site": 3}):
        assert LayerAxis.from_dict(bad) is None
    # an axis with no site (ablations, no per-layer values) keeps its declaration whatever the config's site
    assert LayerAxis(AxisKind.ABLATED, "").at_site("resid_mid") == LayerAxis(AxisKind.ABLATED, "")
    assert LayerAxis().at_site(None) == LayerAxis()
    assert "what the attention of block l adds" in LayerAxis().at_site("attn_out").title
