"""Token view: the corpus coloured per token by a per-token metric at a chosen layer; one token's
metric and logit-lens top-k through the layers, and its nearest tokens at the layer (from the run's store)."""

import html

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import data, links, nearest, ui

WINDOW = 300  # tokens drawn at once
st.title("Token view")
roots = ui.roots()
sources = ui.listed_or_stop(data.token_sources, lambda: ui.missing(
    "linearity", "no per-token arrays (per-token nonlinearity, context memory, logit-lens rank, loss)"))

# a deep link (app/links.py: the logit-lens grid's cells) picks the metric, layer and token, once per link
link = links.read_token_link(st.query_params)
link_source = None if link is None else next(
    (j for j, s in enumerate(sources) if s["rel"] == link["run"] and s["name"] == link["metric"]), None)
fresh_link = link_source is not None and st.session_state.get("tok-link") != link
if fresh_link:
    st.session_state["tok-link"] = link
    st.session_state["tok-metric"] = link_source
i = st.selectbox("metric", range(len(sources)), format_func=lambda j: sources[j]["label"], key="tok-metric")
src = sources[i or 0]
name = src["name"]
m = data.token_matrix(roots.results, roots.stores, src["rel"], name)
run, values, index, texts, order = m["run"], m["values"], m["index"], m["texts"], m["order"]
if fresh_link:
    if link["layer"] in m["layers"]:
        st.session_state["tok-layer"] = link["layer"]
    hit = np.flatnonzero(index[order] == link["token"])
    if hit.size:
        st.session_state["tok-start"] = int(hit[0]) // WINDOW * WINDOW
        st.session_state["tok-pick"] = int(order[hit[0]])
layer = ui.layer_slider(m["layers"], key="tok-layer")
li = m["layers"].index(int(layer))
n = len(order)
start = 0
if n > WINDOW:
    start = st.number_input(f"first token (of {n})", 0, n - 1, None if "tok-start" in st.session_state else 0,
                            step=WINDOW, key="tok-start") or 0
shown = order[start:start + WINDOW]
row = values[li]
finite = row[np.isfinite(row)]
lo, hi = (np.percentile(finite, [2, 98]) if finite.size else (0.0, 1.0))
scale = (hi - lo) or 1.0

unit = "" if data.spec(run.record.study) is None else data.spec(run.record.study).unit(name)
alpha = np.clip((row[shown] - lo) / scale, 0, 1)
spans = []
for j, a in zip(shown, np.nan_to_num(alpha, nan=0.0)):
    text = str(texts[j])
    tip = f"{text!r} row {index[j]}: {row[j]:.4g} {unit}"
    spans.append(f"<span title='{html.escape(tip)}' style='background:rgba(220,50,32,{a:.2f});"
                 f"padding:1px 0;border-radius:2px'>{html.escape(text).replace(' ', '&nbsp;')}</span>")
shown_name = ui.label(run.record.study, name)
st.caption(f"{shown_name} at layer {layer}: white = {lo:.3g}, red = {hi:.3g} (2nd–98th percentile)")
st.markdown("<div style='line-height:1.9;font-family:monospace;white-space:pre-wrap' data-testid='lens-tokens'>"
            + "".join(spans) + "</div>", unsafe_allow_html=True)

pick = st.selectbox("token", shown, format_func=lambda j: f"{index[j]}: {str(texts[j])!r}", key="tok-pick")
word = repr(str(texts[pick]))
fig = go.Figure(go.Scatter(x=m["layers"], y=values[:, pick], mode="lines+markers", name=shown_name))
fig.update_layout(title=f"{ui.label(run.record.study, name, unit=False)} of {word} through the layers",
                  xaxis_title=ui.axis_title(run.record.study), yaxis_title=shown_name, height=340,
                  margin=dict(l=60, r=20, t=50, b=50))
fig.update_xaxes(dtick=1 if len(m["layers"]) <= 40 else None)  # whole layers only
st.plotly_chart(fig, key="tok-trace")

# the corpus tokens nearest this one at the layer, when the store the study read is under a root
held = data.run_store(roots, run)
store = None if held is None else nearest.disk_store(*held)
st.subheader(f"Nearest tokens to {word} at this layer")
if store is None:
    st.caption("nearest tokens appear here when the store this run read lies under the results or stores root")
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
