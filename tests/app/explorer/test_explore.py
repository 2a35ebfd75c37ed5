"""The explorer's links, downloads and main-job lines, through ``streamlit.testing`` on synthetic
results (tests/synthetic_runs.py) and a main_job.json written by the main job's own writer."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

APP = Path(__file__).resolve().parents[3] / "app" / "explorer"


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory) -> Path:
    from tests.synthetic_runs import write_synthetic_run

    root = tmp_path_factory.mktemp("results")
    write_synthetic_run(root / "synth", n_layers=6, n_tokens=400, studies=("logit-lens", "senses", "linearity"))
    return root


@pytest.fixture()
def env(synth_root, monkeypatch):
    monkeypatch.setenv("LENS_APP_RESULTS", str(synth_root))
    monkeypatch.setenv("LENS_APP_STORES", str(synth_root / "no-stores"))
    return synth_root


def _page(name: str, **params):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP / "views" / f"{name}.py"), default_timeout=60)
    for k, v in params.items():
        at.query_params[k] = str(v)
    return at.run()


def _qp(at, name):
    value = at.query_params[name]
    return value[0] if isinstance(value, list) else value


def _no_exception(at):
    assert not at.exception, [e.value for e in at.exception]


def test_token_view_opens_the_linked_token_and_layer(env):
    from app.explorer import links

    params = links.token_params("synth", layer=4, row=357, metric=links.metric_id("logit-lens", "token_rank"))
    at = _page("tokens", **params)
    _no_exception(at)
    assert at.selectbox(key="tok-metric").value is not None
    assert "logit-lens: token_rank" in at.selectbox(key="tok-metric").format_func(at.selectbox(key="tok-metric").value)
    assert at.select_slider(key="tok-layer").value == 4
    assert at.number_input(key="tok-start").value == 300  # the window holding row 357 (300 a window)
    assert at.selectbox(key="tok-pick").format_func(at.selectbox(key="tok-pick").value).startswith("357: ")
    assert {k: _qp(at, k) for k in params} == params
    # the view drives the URL from then on
    at.select_slider(key="tok-layer").set_value(2).run()
    assert _qp(at, "layer") == "2"


def test_token_view_url_contract():
    from app.explorer import links

    assert links.token_view_url("smol", 5, 1234, "logit-lens.token_ce") == \
        "tokens?run=smol&layer=5&token=1234&metric=logit-lens.token_ce"


def test_unknown_linked_token_is_said(env):
    at = _page("tokens", run="synth", token=10**9)
    _no_exception(at)
    assert any("token row 1000000000 is not among" in w.value for w in at.warning), [w.value for w in at.warning]


def test_senses_lemma_from_the_url(env):
    at = _page("senses")
    lemmas = at.selectbox(key="se-lemma").options
    assert len(lemmas) > 1
    at = _page("senses", lemma=lemmas[-1], layer=1, run="synth")
    _no_exception(at)
    assert at.selectbox(key="se-lemma").value == lemmas[-1]
    assert at.select_slider(key="se-layer").value == 1


def test_downloads_are_the_saved_result(env):
    from app.explorer import data

    rel = "synth/logit-lens"
    assert data.result_json_bytes(str(env), rel) == (env / rel / "result.json").read_bytes()
    import io

    with np.load(io.BytesIO(data.arrays_npz_bytes(str(env), rel)), allow_pickle=False) as got, \
            np.load(env / rel / "arrays.npz", allow_pickle=False) as saved:
        assert sorted(got.files) == sorted(saved.files)
        for k in saved.files:
            np.testing.assert_array_equal(got[k], saved[k])
    at = _page("senses")
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == ["result.json", "arrays (.npz)"], labels


def test_study_page_says_what_the_main_job_is_doing(tmp_path, monkeypatch):
    from studies.core.config import StudyConfig
    from studies.job.rows import JobRow, Status
    from studies.job.main_job import _write_job

    shared = StudyConfig(model="m", corpus="c")

    out = tmp_path / "results" / "smol"
    out.mkdir(parents=True)
    names = ["prediction-gains", "senses", "anisotropy", "intrinsic-dim"]
    rows = [JobRow("prediction-gains", Status.OK, "", seconds=12.0),
            JobRow("anisotropy", Status.FAILED, "", seconds=3.0, error="ValueError: boom")]
    now = time.time()
    _write_job(out, shared, {}, rows, names, now - 600, 5.0, finished=False,
               running=["senses"], since={"senses": now - 125}, estimates={"senses": 420.0, "intrinsic-dim": 60.0})
    job = json.loads((out / "main_job.json").read_text())
    assert [r["status"] for r in job["studies"]] == ["ok", "running", "failed", "waiting"]
    monkeypatch.setenv("LENS_APP_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("LENS_APP_STORES", str(tmp_path / "stores"))

    at = _page("senses")
    _no_exception(at)
    info = [i.value for i in at.info]
    assert any(i.startswith("senses is running in run `smol`: 2 min so far, about 4 min left") for i in info), info
    assert not any("no results for senses" in i for i in info)
    at = _page("geometry")  # its first tab: intrinsic dimension (a page builds only the open tab, app.explorer.ui.tabs)
    _no_exception(at)
    assert any(i.startswith("intrinsic-dim is waiting in run `smol` (job running for 10 min)") for i in
               [i.value for i in at.info]), [i.value for i in at.info]
    at.session_state["geometry-tab"] = "anisotropy & rogue dims"
    at.run()
    _no_exception(at)
    assert any("anisotropy failed in run `smol`: ValueError: boom" in e.value for e in at.error), \
        [e.value for e in at.error]
    # a job stopped by Ctrl-C or SIGTERM: nothing runs its studies any more, and the page says so
    _write_job(out, shared, {}, rows, names, now - 600, 5.0, finished=False, running=["senses"],
               since={"senses": now - 125}, stopped="stopped by SIGTERM at 2026-12-03T12:00:00+0000; the same command "
                                                  "with --resume keeps the finished studies and runs the rest")
    from app.explorer import data

    data.job_states.clear()
    at = _page("senses")
    _no_exception(at)
    warned = [w.value for w in at.warning]
    assert any(w.startswith("senses was running in run `smol` when the job was stopped by SIGTERM") and "--resume" in w
               for w in warned), warned
    assert not any("is running" in i.value for i in at.info)
    # once the job has finished, a study it did not run is back to "how to make them"
    _write_job(out, shared, {}, rows, names, now - 600, 5.0, finished=True)
    data.job_states.clear()
    at = _page("senses")
    assert any("no results for senses" in i.value for i in at.info), [i.value for i in at.info]


def test_token_strip_cards_escape_and_take_context_from_the_window():
    import re

    from app.explorer.token_strip import strip_html

    corpus = {"token": np.array(["<a>", "b", "c", "d", "e", "f", "g"]), "window": np.array([0, 0, 0, 0, 1, 1, 1])}
    markup = strip_html(np.array(["c", "e"]), [0, 1], np.array([0.5, np.nan]), lo=0.0, hi=1.0, rows=np.array([2, 4]),
                        context=2, value_name="ce", layer=3, corpus=corpus, picked=1)
    assert re.findall(r"class='ctx'>(.*?)</span>", markup) == ["…&lt;a&gt;b<mark>c</mark>d…", "…<mark>e</mark>fg…"]
    assert "ce at layer 3 = 0.5" in markup and "row 4" in markup
    assert markup.count("class='tok picked'") == 1 and "rgba(220,50,32,0.00)" in markup  # NaN: no colour
    assert "<a>" not in markup
