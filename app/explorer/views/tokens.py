"""Token view: the corpus coloured per token by a per-token metric at a chosen layer (click a token to
pick it; hover for its context and value); one token's metric and logit-lens top-k through the layers,
and its nearest tokens at the layer (from the run's store).

Deep links (:mod:`app.explorer.links`): ``tokens?run=RUN&metric=STUDY.NAME&layer=L&token=ROW`` opens store row
ROW of that run at layer L; the URL follows every change of the view."""

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app.explorer import data, links, nearest, ui
from app.explorer.token_strip import clicked_in_state, strip_html, token_strip

WINDOW = 300  # tokens drawn at once
st.title("Token view")
roots = ui.roots()
sources = ui.listed_or_stop(data.token_sources, lambda: ui.missing(
    "linearity", "no per-token arrays (per-token nonlinearity, context memory, logit-lens rank, loss)"))

# which per-token array: a link's run and metric, else the state kept, else the first (those with text first)
want_run, want_metric = links.url_value(links.RUN), links.url_value(links.METRIC)
if want_run is not None or want_metric is not None:
    fits = [j for j, s in enumerate(sources) if (want_run is None or s["run"] == want_run)
            and (want_metric is None or links.metric_id(s["study"], s["name"]) == want_metric)]
    if fits:
        st.session_state["tok-metric"] = fits[0]
links.seed("tok-metric", list(range(len(sources))), None)
i = st.selectbox("metric", range(len(sources)), format_func=lambda j: sources[j]["label"], key="tok-metric")
src = sources[i or 0]
name = src["name"]
links.remember(links.RUN, src["run"])
links.remember(links.METRIC, links.metric_id(src["study"], name))
m = data.token_matrix(roots.results, roots.stores, src["rel"], name)
run, values, index, texts, order = m["run"], m["values"], m["index"], m["texts"], m["order"]
lookup = data.find_store(roots, run)
layer = ui.layer_slider(m["layers"], key="tok-layer")
li = m["layers"].index(int(layer))
n = len(order)

# a linked token: its window first, then the token itself
want_row = links.url_value(links.TOKEN)
linked = None
if want_row is not None and want_row.lstrip("-").isdigit():
    hit = np.nonzero(index == int(want_row))[0]
    if hit.size:
        linked = int(hit[0])
        rank = int(np.nonzero(order == linked)[0][0])
        st.session_state["tok-start"] = rank // WINDOW * WINDOW
    else:
        st.warning(f"token row {want_row} is not among this result's {n} tokens")
start = 0
if n > WINDOW:
    if st.session_state.get("tok-start", 0) not in range(0, n):
        st.session_state["tok-start"] = 0
    st.session_state.setdefault("tok-start", 0)
    start = int(st.number_input(f"first token (of {n})", 0, n - 1, step=WINDOW, key="tok-start"))
shown = [int(j) for j in order[start:start + WINDOW]]
if linked is not None and linked in shown:
    st.session_state["tok-pick"] = linked
links.seed("tok-pick", shown, None, default=min(8, len(shown) - 1))
row = values[li]
finite = row[np.isfinite(row)]
lo, hi = (np.percentile(finite, [2, 98]) if finite.size else (0.0, 1.0))
shown_name = ui.label(run.record.study, name)  # the declared label and unit
st.caption(f"{shown_name} at layer {layer}: white = {lo:.3g}, red = {hi:.3g} (2nd–98th percentile) · "
           "hover a token for its context and value, click it to pick it")
if m["texts_from"] == data.TEXT_AS_ROWS:
    st.warning("tokens are shown by their store row (#row): this result saved no token text, and "
               + (lookup.message() or "the store's token table does not cover these rows"))
corpus = None if lookup.found is None else data.store_tokens(*lookup.found)  # hover contexts from the corpus


def _take_click():
    """A click on the strip, before the rerun it causes: that token is the pick (one rerun, not two)."""
    clicked = clicked_in_state("tok-strip")
    if clicked is not None:
        st.session_state["tok-pick"] = clicked


@st.fragment  # a click on a token (or a pick in the list) reruns the strip and the token's sections alone
def picked_token() -> None:
    picked = st.session_state.get("tok-pick")
    markup = strip_html(texts, shown, row, lo=float(lo), hi=float(hi), picked=picked, rows=index,
                        value_name=shown_name, layer=layer, order=order, corpus=corpus)
    clicked = token_strip(markup, key="tok-strip", on_click=_take_click)
    if clicked is not None and clicked != picked and clicked in shown:  # the callback did not see it
        st.session_state["tok-pick"] = clicked
        st.rerun(scope="fragment")
    pick = st.selectbox("token", shown, format_func=lambda j: f"{index[j]}: {str(texts[j])!r}", key="tok-pick")
    links.remember(links.TOKEN, int(index[pick]))
    token_sections(pick)


def token_sections(pick: int) -> None:
    """The picked token's metric through the layers, its nearest tokens at the layer, its logit-lens top-k."""
    word = repr(str(texts[pick]))
    fig = go.Figure(go.Scatter(x=m["layers"], y=values[:, pick], mode="lines+markers", name=shown_name))
    fig.update_layout(title=f"{ui.label(run.record.study, name, unit=False)} of {word} through the layers",
                      xaxis_title=ui.axis_title(run.record.study, run.record), yaxis_title=shown_name, height=340,
                      margin=dict(l=60, r=20, t=50, b=50))
    fig.update_xaxes(dtick=1 if len(m["layers"]) <= 40 else None)  # whole layers only
    st.plotly_chart(fig, key="tok-trace")

    # the corpus tokens nearest this one at the layer, in the store the study read (data.find_store)
    held = lookup.found
    store = None if held is None else nearest.disk_store(*held)
    st.subheader(f"Nearest tokens to {word} at this layer")
    if store is None:
        st.warning(lookup.message())
    elif not store.has("resid_post", int(layer)) or int(index[pick]) >= store.n_tokens:
        st.caption(f"the run's store holds no resid_post layer {layer} for this token")
    else:
        nearest.section(*held, "resid_post", int(layer), int(index[pick]), "tok-near", device=roots.store_device)

    # logit-lens top-k of this token through the layers, when a logit-lens result of the same run saved it
    shown_topk = False
    for lr in data.runs_of(roots.results, "logit-lens"):
        if lr.run != run.run:
            continue
        table = data.topk_table(roots.results, lr.rel)
        col = None if table is None else table["row_of"].get(int(index[pick]))
        if col is None:
            continue
        rows = []
        for l_i, l in enumerate(lr.record.layers):
            cells = [str(t) for t in table["tokens"][l_i, col]]
            if table["probs"] is not None:
                cells = [f"{t} ({p:.2f})" for t, p in zip(cells, table["probs"][l_i, col])]
            rows.append({"layer": l, **{f"top{k + 1}": c for k, c in enumerate(cells)}})
        st.subheader(f"{lr.record.study} top-k for {word}")
        st.dataframe(rows, hide_index=True)
        shown_topk = True
    if not shown_topk:
        st.caption("logit-lens top-k per token appears here once a logit-lens result is in this run "
                   "(`lens study logit-lens ...`); the Live page computes it for your own text.")


picked_token()
