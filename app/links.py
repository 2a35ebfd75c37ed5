"""Deep links between the explorer's pages, through ``st.query_params`` (the URL).

The Token view opens at one token and layer from a link ``tokens?run=R&metric=M&layer=L&token=T``:

- ``run``: the result's folder relative to the results root (``app.data.Run.rel``);
- ``metric``: a per-token array of that result (one of the Token view's metrics, e.g. ``token_ce``);
- ``layer``: a layer id of the result's ``layers``; ``token``: a store row (``token_index``).

The logit-lens grid writes these (:func:`token_view_href`); the Token view reads them once per link
(:func:`read_token_link`), so the page's own widgets rule again after the jump. Nothing here imports
streamlit.
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import urlencode

TOKEN_VIEW = "tokens"  # the Token view's url path (app/main.py)
KEYS = ("run", "metric", "layer", "token")


@lru_cache(maxsize=64)
def _token_view_prefix(run: str, metric: str) -> str:
    return f"{TOKEN_VIEW}?" + urlencode({"run": run, "metric": metric})


def token_view_href(run: str, metric: str, layer: int, token: int) -> str:
    """A relative link to the Token view at store row ``token`` and ``layer`` of ``run``'s ``metric``
    (one per grid cell: the quoted part is built once per run and metric)."""
    return f"{_token_view_prefix(run, metric)}&layer={int(layer)}&token={int(token)}"


def read_token_link(params) -> dict | None:
    """``{run, metric, layer, token}`` from query params (a mapping of str -> str), or None when they
    do not name a token (a key missing, a layer or token that is not an integer)."""
    try:
        got = {k: params.get(k) for k in KEYS}
    except AttributeError:
        return None
    if any(v in (None, "") for v in got.values()):
        return None
    try:
        return {"run": str(got["run"]), "metric": str(got["metric"]), "layer": int(got["layer"]),
                "token": int(got["token"])}
    except (TypeError, ValueError):
        return None


# the explorer page (url path) that draws each study's results
STUDY_PAGES = {"prediction-gains": "prediction", "logit-lens": "lenses", "tuned-lens": "lenses",
               "layer-ablation": "ablation", "intrinsic-dim": "geometry", "anisotropy": "geometry",
               "linearity": "geometry", "senses": "senses", "probes": "probes", "context-memory": "probes",
               "filler-tokens": "knobs", "context-knob": "knobs"}


def figure_anchor(rel: str, figure: str) -> str:
    """The HTML id of a result's saved figure on its page (``ui.saved_figures`` writes it)."""
    safe = "".join(c if c.isalnum() else "-" for c in f"{rel}-{figure}")
    return f"fig-{safe}"


def figure_href(study: str, rel: str, figure: str) -> str:
    """A relative link to the page of ``study`` at one of its results' saved figures."""
    page = STUDY_PAGES.get(study, "studies")
    return f"{page}?" + urlencode({"run": rel}) + f"#{figure_anchor(rel, figure)}"
