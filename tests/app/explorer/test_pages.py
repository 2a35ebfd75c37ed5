"""Every explorer page through ``streamlit.testing``: renders on small results without an exception,
degrades to a hint on an empty results root, and responds to its widgets."""

from __future__ import annotations

import pytest

from pathlib import Path

APP = Path(__file__).resolve().parents[3] / "app" / "explorer"
PAGES = ["overview", "tokens", "nearest", "prediction", "lenses", "ablation", "geometry", "senses", "probes", "knobs", "compare", "studies", "live"]


def page_test(name: str):
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(APP / "views" / f"{name}.py"), default_timeout=60)


def _no_exception(at):
    assert not at.exception, [e.value for e in at.exception]


def _strip(at) -> str:
    """The Token view's token strip (app.explorer.token_strip, a components.v2 element): the HTML it was given."""
    found = [e for e in at.get("bidi_component") if e.proto.component_name == "lens_token_strip"]
    assert found, "no token strip on the page"
    return found[0].proto.json


@pytest.mark.parametrize("page", PAGES)
def test_page_renders(app_env, page):
    at = page_test(page).run()
    _no_exception(at)
    assert at.title and at.title[0].value


@pytest.mark.parametrize("page", [p for p in PAGES if p != "live"])
def test_page_without_results_says_how_to_make_them(tmp_path, monkeypatch, page):
    monkeypatch.setenv("LENS_APP_RESULTS", str(tmp_path / "nothing"))
    monkeypatch.setenv("LENS_APP_STORES", str(tmp_path / "nothing"))
    at = page_test(page).run()
    _no_exception(at)
    assert any("no results" in i.value for i in at.info), [i.value for i in at.info]
    assert any("lens study" in i.value for i in at.info)


def test_navigation_visits_every_page(app_env):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP / "main.py"), default_timeout=60).run()
    _no_exception(at)
    titles = {at.title[0].value}
    for page in PAGES[1:]:
        at.switch_page(f"views/{page}.py").run()
        _no_exception(at)
        titles.add(at.title[0].value)
    assert len(titles) == len(PAGES)


def test_overview_lists_runs_and_headlines(app_env):
    at = page_test("overview").run()
    runs = at.dataframe[0].value
    assert {"tiny", "synth", "synth-b"} <= set(runs["run"])
    assert "tiny-llama" in set(runs["model"])
    findings = at.dataframe[1].value  # judged findings (test_findings.py), then the headline numbers
    assert {"verdict", "95% interval", "figure"} <= set(findings.columns)
    heads = at.dataframe[2].value
    assert "−0.983 … −0.997" in " ".join(heads["seed claim"])
    card = at.dataframe[3].value
    assert "n_layers" in set(card["field"]) or "studies" in set(card["field"])


def test_token_view_slider_and_token_pick(app_env):
    at = page_test("tokens").run()
    labels = at.selectbox(key="tok-metric").options
    assert any("linearity: nonlinearity" in o for o in labels)
    tiny = next(i for i, o in enumerate(labels) if "linearity: nonlinearity" in o and "tiny" in o)
    at.selectbox(key="tok-metric").set_value(tiny).run()
    _no_exception(at)
    first = at.caption[0].value
    layers = at.select_slider(key="tok-layer").options
    at.select_slider(key="tok-layer").set_value(int(layers[0])).run()
    _no_exception(at)
    assert at.caption[0].value != first and f"layer {layers[0]}" in at.caption[0].value
    assert _strip(at).count("class='tok") >= 200 and "class='card'" in _strip(at)
    at.selectbox(key="tok-pick").select_index(3).run()
    _no_exception(at)


def test_token_view_shows_logit_lens_topk(app_env):
    at = page_test("tokens").run()
    labels = at.selectbox(key="tok-metric").options
    synth = next(i for i, o in enumerate(labels) if o.startswith("logit-lens: token_ce") and "synth ·" in o)
    at.selectbox(key="tok-metric").set_value(synth).run()
    _no_exception(at)
    assert any("top-k" in s.value for s in at.subheader)
    assert "top1" in at.dataframe[0].value.columns


def test_family_pages_draw_their_plots(app_env):
    for page, key in [("prediction", "pg-run"), ("ablation", "ab-run"), ("senses", "se-run")]:
        at = page_test(page).run()
        options = at.selectbox(key=key).options
        at.selectbox(key=key).set_value(next(i for i, o in enumerate(options) if o.startswith("synth ·"))).run()
        _no_exception(at)
        assert len(at.get("plotly_chart")) >= 1, page


def open_tab(at, page: str, title: str):
    """Open a page's tab (app.explorer.ui.tabs: only the open tab's content is built) and rerun."""
    at.session_state[f"{page}-tab"] = title
    return at.run()


def test_lens_page_offers_the_jacobian_lens_as_a_third_lens(app_env):
    at = open_tab(page_test("lenses").run(), "lenses", "tuned lens")
    _no_exception(at)
    figures = " ".join(c.proto.spec for c in at.get("plotly_chart"))
    assert "Jacobian lens" in figures and "two half-fits compared" in figures
    assert any("Jacobian lens: fitted on 4 training windows" in c.value for c in at.caption)


def test_geometry_rogue_slider(app_env):
    at = open_tab(page_test("geometry").run(), "geometry", "anisotropy & rogue dims")
    options = at.selectbox(key="an-run").options
    at.selectbox(key="an-run").set_value(next(i for i, o in enumerate(options) if o.startswith("synth ·"))).run()
    at.select_slider(key="an-layer").set_value(1).run()
    _no_exception(at)
    assert len(at.get("plotly_chart")) >= 3


def test_tabs_build_the_open_tab_only_and_a_figure_link_opens_its_tab(app_env):
    """A page's tabs are built while open (the geometry page drew nine figures for its first paint, six of
    them hidden); a finding's link to a saved figure names the tab, opens the result's details and draws
    the figure."""
    from urllib.parse import parse_qsl, urlsplit

    from app.explorer import links

    at = page_test("geometry").run()
    _no_exception(at)
    assert at.selectbox(key="id-run") is not None
    for hidden in ("an-run", "lin-run"):
        with pytest.raises(KeyError):
            at.selectbox(key=hidden)
    assert at.session_state["id-generic-open"] is False  # the details expander: closed, so not built
    assert not any(e.key == "id-generic-metrics" for e in at.get("multiselect"))

    open_tab(at, "geometry", "linearity")
    _no_exception(at)
    with pytest.raises(KeyError):
        at.selectbox(key="id-run")
    assert at.selectbox(key="lin-run") is not None

    # a finding's link: page, run, tab and figure in the URL
    # the real linearity study of the "tiny" run saved its figures (the synthetic runs' linearity saved none)
    figures = sorted(p.stem for p in (app_env / "tiny" / "linearity" / "figures").glob("*.json"))
    assert figures
    href = links.figure_href("linearity", "tiny", "tiny/linearity", figures[0])
    url = urlsplit(href)
    assert url.path == "geometry" and url.fragment == links.figure_anchor("tiny/linearity", figures[0])
    params = dict(parse_qsl(url.query))
    assert params[links.TAB] == "linearity" and params[links.FIGURE] == url.fragment
    at = page_test("geometry")
    for k, v in params.items():
        at.query_params[k] = v
    at.run()
    _no_exception(at)
    assert at.session_state["geometry-tab"] == "linearity"
    run = at.selectbox(key="lin-run")
    assert run.options[run.index].startswith("tiny ·"), run.options
    assert at.session_state["lin-generic-open"] is True
    anchors = [m.value for m in at.markdown if "<a id=" in m.value]
    assert f"<a id='{url.fragment}'></a>" in anchors, anchors


def test_senses_projection_by_lemma(app_env):
    at = page_test("senses").run()
    at.selectbox(key="se-lemma").set_value("bass").run()
    at.select_slider(key="se-layer").set_value(0).run()
    _no_exception(at)


def test_compare_two_runs(app_env):
    at = page_test("compare").run()
    at.selectbox(key="cmp-study").set_value("anisotropy").run()
    at.selectbox(key="cmp-b").set_value(1).run()
    at.checkbox(key="cmp-rel").check().run()
    _no_exception(at)
    assert at.get("plotly_chart")


def test_live_runs_tiny_model(app_env):
    at = page_test("live").run()
    at.selectbox(key="live-model").set_value("tiny-llama")
    at.text_area(key="live-text").input("one two three four")
    at.button(key="live-run").click().run()
    _no_exception(at)
    assert at.get("plotly_chart")
    assert "top1" in at.dataframe[0].value.columns
    at.select_slider(key="live-layer").set_value(0).run()
    _no_exception(at)


def test_result_pointing_outside_roots_is_not_opened(app_env, tmp_path, monkeypatch):
    """A result.json whose config names a store outside the roots: the token view must not read it."""
    import numpy as np

    from studies.reporting.results import write_result

    root = tmp_path / "res"
    write_result(root / "evil", study="linearity", model="m", corpus="c", n_tokens=3,
                 config={"store": "/etc"}, layers=[0, 1], metrics={"linearity": [1, 1]}, summary={},
                 arrays={"token_index": np.arange(3), "nonlinearity": np.ones((2, 3), dtype=np.float32)})
    monkeypatch.setenv("LENS_APP_RESULTS", str(root))
    at = page_test("tokens").run()
    _no_exception(at)
    assert "#0" in _strip(at)
    assert any("/etc (the recorded path; outside the results and stores roots, not opened)" in w.value
               for w in at.warning), [w.value for w in at.warning]


def test_probes_page_draws_probe_and_context_memory(app_env):
    at = page_test("probes").run()
    charts = 0
    for key, tab in (("pr-run", "linear probes"), ("cm-run", "context memory")):
        open_tab(at, "probes", tab)
        options = at.selectbox(key=key).options
        at.selectbox(key=key).set_value(next(i for i, o in enumerate(options) if o.startswith("synth ·"))).run()
        _no_exception(at)
        charts += len(at.get("plotly_chart"))
    at.select_slider(key="cm-layer").set_value(0).run()
    _no_exception(at)
    assert charts >= 3


def _tiny_store(results_root):
    import lens

    return lens.open_store(results_root / "tiny" / "store")


def test_nearest_tokens_page_answers_a_query(app_env):
    import geometry

    store = _tiny_store(app_env)
    at = page_test("nearest").run()
    _no_exception(at)
    assert at.selectbox(key="nt-store").options[0] == "stores: store"  # listed once, though under both roots
    assert any("held on **cpu**" in c.value for c in at.caption)
    layer, row = int(at.select_slider(key="nt-layer").value), int(at.selectbox(key="nt-row").value)
    table = at.dataframe[0].value
    assert list(table.columns[:4]) == ["rank", "token", "distance", "context"] and len(table) == 10
    ref = geometry.nearest(store.view("resid_post"), row, 10, layer=layer, eligible=store.mask(min_pos=1))
    assert table["row"].tolist() == ref.rows[0].tolist()
    assert table["distance"].tolist() == ref.distances[0].tolist()
    assert all("⟦" in c and "⟧" in c for c in table["context"])
    assert "<mark" in next(m.value for m in at.markdown if m.value.startswith("**query**"))

    at.selectbox(key="nt-k").set_value(5).run()
    at.radio(key="nt-metric").set_value("euclidean").run()
    at.select_slider(key="nt-layer").set_value(0).run()
    _no_exception(at)
    ref = geometry.nearest(store.view("resid_post"), row, 5, layer=0, metric="euclidean", eligible=store.mask(min_pos=1))
    assert at.dataframe[0].value["row"].tolist() == ref.rows[0].tolist()

    at.radio(key="nt-how").set_value("by text").run()
    at.text_input(key="nt-find").input("the").run()
    _no_exception(at)
    hit = int(at.selectbox(key="nt-hit").value)
    assert "the" in store.tokens["token"][hit].lower()
    assert len(at.dataframe[0].value) == 5 and hit not in at.dataframe[0].value["row"].tolist()


def test_nearest_tokens_page_names_a_missing_device(app_env, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    monkeypatch.setenv("LENS_APP_STORE_DEVICE", "cuda")
    at = page_test("nearest").run()
    _no_exception(at)
    assert any("'cuda'" in e.value and "expected cpu" in e.value for e in at.error), [e.value for e in at.error]


def test_token_view_shows_nearest_tokens_from_the_runs_store(app_env):
    at = page_test("tokens").run()
    labels = at.selectbox(key="tok-metric").options
    tiny = next(i for i, o in enumerate(labels) if "linearity: nonlinearity" in o and "tiny" in o)
    at.selectbox(key="tok-metric").set_value(tiny).run()
    at.selectbox(key="tok-pick").select_index(3).run()
    _no_exception(at)
    assert any(s.value.startswith("Nearest tokens to") for s in at.subheader)
    near = next(d.value for d in at.dataframe if "context" in d.value.columns)
    assert len(near) == 10 and near["distance"].is_monotonic_increasing
    # a run whose store is not under a root (the synthetic runs name none) says why there is no table
    synth = next(i for i, o in enumerate(labels) if "synth ·" in o)
    at.selectbox(key="tok-metric").set_value(synth).run()
    _no_exception(at)
    assert any("this result records no store" in w.value for w in at.warning), [w.value for w in at.warning]


def test_lens_grid_window_change_starts_at_the_first_positions(app_env):
    """One positions slider serves every window of the grid: a new window starts at its first positions (not
    at the range picked in the last one), and a kept range longer than the window is dropped, not an error."""
    at = page_test("lenses").run()
    _no_exception(at)
    windows = at.selectbox(key="ll-grid-window")
    if len(windows.options) < 2:
        pytest.skip("the test results hold one window")
    positions = at.slider(key="ll-grid-pos")
    first = positions.value
    assert first[0] == 0 and first[1] >= 1
    positions.set_value((1, first[1])).run()
    _no_exception(at)
    assert at.slider(key="ll-grid-pos").value == (1, first[1])
    at.selectbox(key="ll-grid-window").set_value(1).run()
    _no_exception(at)
    assert at.slider(key="ll-grid-pos").value[0] == 0
    at.session_state["ll-grid-pos"] = (0, 10_000)  # as another run's longer window would leave it
    at.run()
    _no_exception(at)
    assert at.slider(key="ll-grid-pos").value[1] < 10_000


def test_a_figure_link_opens_the_saved_figures_on_a_page_without_tabs(app_env):
    """The prediction page draws its saved figures in a collapsed expander: a link to one opens it."""
    from urllib.parse import parse_qsl, urlsplit

    from app.explorer import links

    figures = sorted(p.stem for p in (app_env / "tiny" / "prediction-gains" / "figures").glob("*.json"))
    assert figures
    url = urlsplit(links.figure_href("prediction-gains", "tiny", "tiny/prediction-gains", figures[0]))
    params = dict(parse_qsl(url.query))
    assert url.path == "prediction" and links.TAB not in params

    def saved(at):
        return next(e for e in at.expander if e.label == "saved figures")

    at = page_test("prediction").run()
    _no_exception(at)
    assert not saved(at).proto.expanded
    at = page_test("prediction")
    for k, v in params.items():
        at.query_params[k] = v
    at.run()
    _no_exception(at)
    assert saved(at).proto.expanded
    assert f"<a id='{url.fragment}'></a>" in [m.value for m in at.markdown]


def test_damaged_results_are_named_not_raised(app_env, tmp_path, monkeypatch):
    """A result.json of another shape is left out and listed on the Overview with why; a damaged
    arrays.npz stops the page that reads it with one error naming the file, not an exception."""
    import json
    import shutil

    root = tmp_path / "results"
    shutil.copytree(app_env / "synth", root / "synth")
    record = root / "synth" / "linearity" / "result.json"
    raw = json.loads(record.read_text())
    raw["metrics"] = {k: "n/a" for k in raw["metrics"]}
    record.write_text(json.dumps(raw))
    lens_arrays = root / "synth" / "logit-lens" / "arrays.npz"
    lens_arrays.write_bytes(lens_arrays.read_bytes()[:100])  # cut short
    monkeypatch.setenv("LENS_APP_RESULTS", str(root))
    monkeypatch.setenv("LENS_APP_STORES", str(root))

    at = page_test("overview").run()
    _no_exception(at)
    warning = " ".join(w.value for w in at.warning)
    assert "1 results folder(s) left out" in warning and "synth/linearity" in warning
    assert "must hold one value per layer" in warning and str(root) not in warning

    at = page_test("lenses").run()
    _no_exception(at)
    assert any("synth/logit-lens/arrays.npz is damaged and cannot be read" in e.value for e in at.error), \
        [e.value for e in at.error]
    # the Token view offers the per-token metrics of the results that read, without the damaged one's
    at = page_test("tokens").run()
    _no_exception(at)
    sources = [str(o) for box in at.selectbox for o in box.options if " — synth · " in str(o)]
    assert sources and not any(o.startswith(("logit-lens:", "linearity:")) for o in sources), sources


def test_a_damaged_store_is_named_not_raised(app_env, tmp_path, monkeypatch):
    """A store whose manifest is cut short: the Nearest tokens page says which file and why when it is
    picked, and the Token view's search for the run's store lists it as damaged and goes on."""
    import shutil

    _tiny_store(app_env)
    stores = tmp_path / "stores"
    shutil.copytree(app_env / "tiny" / "store", stores / "store")
    manifest = stores / "store" / "manifest.json"
    manifest.write_text(manifest.read_text()[:200])
    monkeypatch.setenv("LENS_APP_STORES", str(stores))

    at = page_test("nearest").run()
    _no_exception(at)
    box = at.selectbox(key="nt-store")
    damaged = next(o for o in box.options if o.startswith("stores: "))
    box.set_value(damaged).run()
    _no_exception(at)
    assert any("store/manifest.json: is not valid JSON" in e.value for e in at.error), [e.value for e in at.error]

    from app.explorer import data
    from app.explorer.state import Roots

    run = next(r for r in data.list_runs(str(app_env)) if r.record.study == "linearity" and r.run == "tiny")
    lookup = data.find_store(Roots(str(app_env), str(stores)), run)
    assert lookup.found is not None  # the run's own store, under the results root
    moved = tmp_path / "moved"  # the run's folder alone, its store gone: only the damaged one is named alike
    shutil.copytree(app_env / "tiny" / "linearity", moved / "tiny" / "linearity")
    run = next(r for r in data.list_runs(str(moved)) if r.record.study == "linearity")
    lookup = data.find_store(Roots(str(moved), str(stores)), run)
    assert lookup.found is None and "damaged" in lookup.message() and "not valid JSON" in lookup.message()
