"""Deep links: the view a page shows, named in its URL (``st.query_params``).

Opening a URL reopens the same view; changing the view rewrites the URL. The page is the URL's path
(``/tokens``); the rest are query parameters, each spelled here once:

    run     the run a page shows: a main job's folder under the results root (:attr:`app.data.Run.run`)
    metric  Token view: which per-token array, ``<study>.<name>`` (``logit-lens.ce``)
    layer   the layer, as the result's ``layers`` number it
    token   Token view: the token's row in the run's store (the study's token-row array holds it)
    lemma   Senses: the lemma whose contexts are drawn

A value a link names wins over the widget's state once (a new URL is a new request); after that the
widget drives and the URL follows it. :func:`token_view_url` / :func:`open_token` are the contract
other pages (the Logit lens grid) use to open one token at one layer in the Token view.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

RUN, METRIC, LAYER, TOKEN, LEMMA = "run", "metric", "layer", "token", "lemma"
TOKEN_PAGE = "tokens"  # the Token view's URL path (app/main.py's PAGES)
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
    import streamlit as st

    st.switch_page(str(Path(__file__).resolve().parent / "views" / "tokens.py"),
                   query_params=token_params(run, layer, row, metric))


def url_value(param: str) -> str | None:
    """The parameter's value when the URL names one this session has not taken yet, else None."""
    import streamlit as st

    raw = st.query_params.get(param)
    seen = st.session_state.setdefault(_SEEN, {})
    if raw is None or raw == seen.get(param):
        return None
    seen[param] = raw
    return raw


def remember(param: str, value) -> None:
    """Write the view's value to the URL (and note it as taken)."""
    import streamlit as st

    text = str(value)
    st.session_state.setdefault(_SEEN, {})[param] = text
    if st.query_params.get(param) != text:
        st.query_params[param] = text


def seed(key: str, options: list, param: str | None, encode=str, default: int = 0) -> None:
    """Before a widget with ``key`` over ``options`` is drawn: its state from the URL when a new link
    names one of them, else kept when still valid, else ``options[default]``."""
    import streamlit as st

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


def figure_anchor(rel: str, figure: str) -> str:
    """The HTML id of a result's saved figure on its page (``ui.saved_figures`` writes it)."""
    safe = "".join(c if c.isalnum() else "-" for c in f"{rel}-{figure}")
    return f"fig-{safe}"


def figure_href(study: str, run: str, rel: str, figure: str) -> str:
    """A relative link to the page of ``study`` at one of its results' saved figures: ``run`` (the main
    job's folder, :attr:`app.data.Run.run`) picks the result, ``rel`` names the figure's anchor."""
    page = STUDY_PAGES.get(study, "studies")
    return f"{page}?" + urlencode({RUN: run}) + f"#{figure_anchor(rel, figure)}"
