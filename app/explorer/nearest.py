"""Nearest tokens in the explorer: store layers held on the launch device, asked with :func:`geometry.nearest`.

The explorer holds *layers*, not whole stores (``st.cache_resource``, at most :data:`HELD_LAYERS` per
server process, on ``--store-device``): a query reads one layer, and every layer of a large model's
store would not fit a GPU. The first query at a layer reads it from disk onto the device (cold); later
ones find it there (warm). Nothing here runs a model. The Nearest tokens page and the Token view both
draw their section with :func:`section`.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass

import streamlit as st

from app.explorer import data
from app.explorer.paths import safe_path
import lens
from lens.runtime.devices import parse_device
import geometry
from lens.errors import LensInputError

HELD_LAYERS = 8
KS = (5, 10, 20, 50)


@st.cache_resource(ttl=data.TTL_S, max_entries=8, show_spinner=False)
def disk_store(root: str, rel: str):
    """The store under ``root``, memory-mapped (its manifest and token table read, no layer)."""
    return lens.open_store(safe_path(root, rel))


@st.cache_resource(max_entries=HELD_LAYERS, show_spinner="reading the layer onto the device")
def held_layer(root: str, rel: str, seal: str, site: str, layer, device: str):
    """One layer of the store, held on ``device`` (keyed by the manifest's seal: a store captured
    again in the same folder is read again)."""
    device = parse_device(device)
    return disk_store(root, rel).get(layer=layer, site=site).to(device)


@dataclass(frozen=True)
class Answer:
    """A nearest-tokens query and what it found: ``found`` (:class:`geometry.Nearest`, one query),
    ``query`` and ``contexts`` (:class:`lens.store.contexts.TokenContext`, one per neighbour),
    ``n_eligible`` rows it chose from, where the layer is held and how long the query took."""

    found: object
    query: object
    contexts: list
    n_eligible: int
    device: str
    shape: tuple
    dtype: str
    seconds: float


def ask(root: str, rel: str, site: str, layer, row: int, k: int, metric: str, device: str, *,
        include_edges: bool = False, width: int = 8) -> Answer:
    """The ``k`` tokens nearest store row ``row`` at ``site``/``layer``, with contexts ``width`` wide.

    Candidates are the rows the geometry studies analyse (no special tokens, no window position 0:
    an attention sink with massive activations) unless ``include_edges``."""
    store = disk_store(root, rel)
    X = held_layer(root, rel, (store.manifest.checksum or ""), site, layer, device)
    eligible = store.mask(drop_special=not include_edges, min_pos=0 if include_edges else 1)
    t0 = time.perf_counter()
    found = geometry.nearest(X, int(row), int(k), metric=metric, eligible=eligible)
    seconds = time.perf_counter() - t0
    ctx = store.contexts([int(row), *found.rows[0].tolist()], width)
    return Answer(found, ctx[0], ctx[1:], int(eligible.sum()), str(X.device), tuple(X.shape),
                  str(X.dtype).replace("torch.", ""), seconds)


@st.cache_data(ttl=data.TTL_S, max_entries=512, show_spinner=False)
def answer(root: str, rel: str, seal: str, site: str, layer, row: int, k: int, metric: str, device: str,
           include_edges: bool, width: int) -> Answer:
    """:func:`ask`, kept for the server's sessions: a query asked again (the same store, by its seal,
    row, layer, k, metric and context) is answered without reading or searching the layer again;
    its ``seconds`` are those of the search when it ran."""
    return ask(root, rel, site, layer, row, k, metric, device, include_edges=include_edges, width=width)


def _visible(text: str) -> str:
    return text.replace("\n", "⏎").replace("\t", "⇥")


def context_html(ctx) -> str:
    """The context as text with the token itself highlighted."""
    def esc(t):
        return html.escape(_visible(t))

    return ("<span style='font-family:monospace;white-space:pre-wrap'>" + esc(ctx.before)
            + "<mark style='background:#f5c542;padding:0 2px;border-radius:2px'>" + esc(ctx.token) + "</mark>"
            + esc(ctx.after) + "</span>")


def table(answer: Answer) -> list[dict]:
    """One row per neighbour, nearest first."""
    f = answer.found
    return [{"rank": i + 1, "token": repr(c.token), "distance": float(f.distances[0, i]),
             "context": _visible(c.marked()), "row": int(c.row), "doc": c.doc, "window": c.window, "pos": c.pos}
            for i, c in enumerate(answer.contexts)]


def section(root: str, rel: str, site: str, layer, row: int, key: str, *, device: str) -> Answer | None:
    """k / metric / context controls, the query's context and a table of its nearest tokens."""
    c1, c2, c3, c4 = st.columns(4)
    k = c1.selectbox("k", KS, index=1, key=f"{key}-k")
    metric = c2.radio("metric", geometry.METRICS, horizontal=True, key=f"{key}-metric")
    width = c3.slider("context (tokens each side)", 2, 24, 8, key=f"{key}-width")
    edges = c4.checkbox("include special tokens and position 0", False, key=f"{key}-edges")
    try:
        seal = (disk_store(root, rel).manifest.checksum or "")
        got = answer(root, rel, seal, site, layer, int(row), int(k), metric, device, bool(edges), int(width))
    except LensInputError as exc:
        st.error(str(exc))
        return None
    at = f"{site}" if layer is None else f"{site} layer {layer}"
    st.markdown(f"**query** (row {row}, {at}): " + context_html(got.query), unsafe_allow_html=True)
    st.dataframe(table(got), hide_index=True, key=f"{key}-table",
                 column_config={"distance": st.column_config.NumberColumn(format="%.4f")})
    n, d = got.shape
    st.caption(f"layer held on **{got.device}** ({n} tokens × {d}, {got.dtype}); "
               f"{metric} distance over {got.n_eligible} eligible tokens, exact; "
               f"query {got.seconds * 1e3:.1f} ms")
    return got


def store_choices(roots) -> list[tuple[str, str]]:
    """(root, path under it) of every store under the stores root, then under the results root."""
    out, seen = [], set()
    for root in (roots.stores, roots.results):
        for rel in data.list_stores(root):
            real = safe_path(root, rel)
            if real not in seen:
                seen.add(real)
                out.append((root, rel))
    return out

