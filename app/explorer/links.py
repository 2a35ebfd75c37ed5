"""Deep links: the view a page shows, named in its URL (``st.query_params``).

Opening a URL reopens the same view; changing the view rewrites the URL. The page is the URL's path
(``/tokens``); the rest are query parameters, each spelled here once:

    run     the run a page shows: a main job's folder under the results root (:attr:`app.explorer.data.RunResult.run`)
    metric  Token view: which per-token array, ``<study>.<name>`` (``logit-lens.ce``)
    layer   the layer, as the result's ``layers`` number it
    token   Token view: the token's row in the run's store (the study's token-row array holds it)
    lemma   Senses: the lemma whose contexts are drawn
    tab     a page with tabs: the tab open (its title, :data:`PAGE_TABS`)
    figure  a result's saved figure to draw and scroll to (:func:`figure_anchor`), from a finding's link

A value a link names wins over the widget's state once (a new URL is a new request); after that the
widget drives and the URL follows it. :func:`token_view_url` / :func:`open_token` are the contract
other pages (the Logit lens grid) use to open one token at one layer in the Token view.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

import streamlit as st

RUN, METRIC, LAYER, TOKEN, LEMMA, TAB, FIGURE = "run", "metric", "layer", "token", "lemma", "tab", "figure"
TOKEN_PAGE = "tokens"  # the Token view's URL path (app/explorer/main.py's PAGES)
_SEEN = "lens_url_seen"  # session_state: the value of each parameter this session last wrote or took


def metric_id(study: str, name: str) -> str:
    """The ``metric`` parameter of a study's per-token array."""
    return f"{study}.{name}"


def token_params(run: str, layer: int, row: int, metric: str | None = None) -> dict:
    """Query parameters that open store row ``row`` of ``run`` at ``layer`` in the Token view;
    ``metric`` (:func:`metric_id`) picks the array coloured, else the run's first per-token array."""
    params = {RUN: str(run), LAYER: str(int(layer)), TOKEN: str(int(row))}
    if metric:
        params[METRIC] = metric
    return params


def token_view_url(run: str, layer: int, row: int, metric: str | None = None) -> str:
    """A relative URL (``tokens?run=…&layer=…&token=…``) of that view, for a link in a page."""
    return f"{TOKEN_PAGE}?{urlencode(token_params(run, layer, row, metric))}"


def open_token(run: str, layer: int, row: int, metric: str | None = None):
    """From a page's script (a click handled in Python): switch to the Token view at that token."""
    st.switch_page(str(Path(__file__).resolve().parent / "views" / "tokens.py"),
                   query_params=token_params(run, layer, row, metric))


def url_value(param: str) -> str | None:
    """The parameter's value when the URL names one this session has not taken yet, else None."""
    raw = st.query_params.get(param)
    seen = st.session_state.setdefault(_SEEN, {})
    if raw is None or raw == seen.get(param):
        return None
    seen[param] = raw
    return raw


def remember(param: str, value) -> None:
    """Write the view's value to the URL (and note it as taken)."""
    text = str(value)
    st.session_state.setdefault(_SEEN, {})[param] = text
    if st.query_params.get(param) != text:
        st.query_params[param] = text


def seed(key: str, options: list, param: str | None, encode=str, default: int = 0) -> None:
    """Before a widget with ``key`` over ``options`` is drawn: its state from the URL when a new link
    names one of them, else kept when still valid, else ``options[default]``."""
    if not options:
        return
    raw = url_value(param) if param else None
    if raw is not None:
        for o in options:
            if encode(o) == raw:
                st.session_state[key] = o
                return
    if key not in st.session_state or st.session_state[key] not in options:
        st.session_state[key] = options[min(max(default, 0), len(options) - 1)]


# the explorer page (url path) that draws each study's results
STUDY_PAGES = {"prediction-gains": "prediction", "logit-lens": "lenses", "tuned-lens": "lenses",
               "layer-ablation": "ablation", "intrinsic-dim": "geometry", "anisotropy": "geometry",
               "linearity": "geometry", "senses": "senses", "probes": "probes", "context-memory": "probes",
               "filler-tokens": "knobs", "context-knob": "knobs"}


# the tabs of the pages that have them, in order, each with the study it draws (None: several); a page's
# tabs are built only while open (app.explorer.ui.tabs), so a link to a study's figure names its tab
PAGE_TABS = {
    "lenses": (("logit lens: per layer", "logit-lens"), ("tuned lens", "tuned-lens")),
    "geometry": (("intrinsic dimension", "intrinsic-dim"), ("anisotropy & rogue dims", "anisotropy"),
                 ("linearity", "linearity")),
    "probes": (("linear probes", "probes"), ("context memory", "context-memory")),
    "knobs": (("filler tokens", "filler-tokens"), ("original vs transformed", None), ("context knob", "context-knob")),
}


def study_tab(study: str) -> str | None:
    """The title of the tab that draws ``study`` on its page, None when its page has no tabs."""
    return next((t for t, s in PAGE_TABS.get(STUDY_PAGES.get(study, ""), ()) if s == study), None)


def url_names(param: str, value: str) -> bool:
    """True when the URL's ``param`` is ``value`` and this session has not taken it yet (then taken):
    unlike :func:`url_value`, a value meant for another part of the page is left for it."""
    seen = st.session_state.setdefault(_SEEN, {})
    if st.query_params.get(param) != value or seen.get(param) == value:
        return False
    seen[param] = value
    return True


def figure_anchor(rel: str, figure: str) -> str:
    """The HTML id of a result's saved figure on its page (``ui.saved_figures`` writes it)."""
    safe = "".join(c if c.isalnum() else "-" for c in f"{rel}-{figure}")
    return f"fig-{safe}"


def figure_href(study: str, run: str, rel: str, figure: str) -> str:
    """A relative link to the page of ``study`` at one of its results' saved figures: ``run`` (the main
    job's folder, :attr:`app.explorer.data.RunResult.run`) picks the result, ``rel`` names the figure's anchor."""
    page = STUDY_PAGES.get(study, "studies")
    anchor = figure_anchor(rel, figure)
    tab = study_tab(study)
    params = {RUN: run, **({TAB: tab} if tab else {}), FIGURE: anchor}
    return f"{page}?" + urlencode(params) + f"#{anchor}"
