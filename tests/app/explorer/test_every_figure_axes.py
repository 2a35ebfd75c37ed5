"""Every saved figure of every study is readable (issue #38): a real main job on tiny-llama (every available study,
300 tokens) writes each study's figures as it would for a user, plotly.js draws each one in headless Chromium, and
every axis a trace sits on must carry a title and at least two tick labels (tests/app/explorer/figure_axes.py reads
back what was drawn, not what the JSON asks for). A subplot figure whose panels are named only by their subplot
titles failed here (their y axes had no title), as did the Prediction gains page's narrow log axis in the explorer
(tests/app/explorer/test_figure_axes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from figure_axes import CHROMIUM, read_axes, unreadable

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.timeout(900)]
# tiny settings: the tuned lens' few steps and the context knob without its known-facts filter (a random-weight
# model knows no capital) change the numbers, not which figures are drawn or how their axes are set
PARAMS = {"steps": "5", "require_known": "false"}


@pytest.fixture(scope="module")
def saved_figures(tmp_path_factory) -> dict:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (scripts/system_deps.sh)")
    pytest.importorskip("playwright.sync_api")
    from studies.job.main_job import run_all

    out = tmp_path_factory.mktemp("every-figure")
    base = {"model": "tiny-llama", "corpus": "wiki-sample", "max_tokens": 300, "seq_len": 128, "batch_size": 8,
            "device": "cpu", "store": None, "seed": 0, "progress": False}
    rows = run_all(base, out, params=PARAMS, progress=False)
    assert all(r["status"] == "ok" for r in rows), [(r["study"], r["status"], r["error"]) for r in rows]
    return {f"{p.parent.parent.name}/{p.stem}": json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(out.glob("*/figures/*.json"))}


def test_every_study_saved_figures(saved_figures):
    from studies.core.registry import available

    assert {name.split("/")[0] for name in saved_figures} == set(available()), sorted(saved_figures)


def test_every_axis_of_every_saved_figure_has_a_title_and_two_tick_labels(saved_figures):
    drawn = read_axes(saved_figures)
    assert all(drawn.values()), [name for name, axes in drawn.items() if not axes]  # each figure has axes
    bad = {name: unreadable(axes) for name, axes in drawn.items() if unreadable(axes)}
    assert not bad, bad


def test_the_check_sees_a_missing_title_and_a_single_tick_label():
    """The reader itself: an untitled axis and an axis of one value (one tick label) are both caught."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing")
    fig = {"data": [{"type": "bar", "x": ["only"], "y": [0.5, 0.7], "xaxis": "x", "yaxis": "y"}],
           "layout": {"xaxis": {"title": {"text": "condition"}}}}
    (axes,) = read_axes({"f": fig}).values()
    problems = unreadable(axes)
    assert any("y has no title" in p for p in problems) and any(p.startswith("x (category") for p in problems), problems
