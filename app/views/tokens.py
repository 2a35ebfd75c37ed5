"""Token view: the corpus coloured per token by a per-token metric at a chosen layer; one token's
metric and logit-lens top-k through the layers."""

import html

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import data, ui
from app.paths import UnsafePathError

WINDOW = 300  # tokens drawn at once
st.title("Token view")
roots = ui.roots()
try:
    found = data.list_runs(roots.results)
except UnsafePathError as exc:
    st.error(str(exc))
    st.stop()

sources = []  # (label, record, array name)
for r in found:
    arrays = data.load_arrays(roots.results, r["rel"])
    for name in data.per_token_metrics(arrays, len(r["layers"])):
        sources.append((f"{r['study']}: {name} — {ui.run_label(r)}", r, name, "token" in arrays))
sources = [s[:3] for s in sorted(sources, key=lambda s: not s[3])]  # those with token text first
if not sources:
    ui.missing("linearity", "no per-token arrays (per-token nonlinearity, context memory, logit-lens rank, loss)")
    st.stop()

i = st.selectbox("metric", range(len(sources)), format_func=lambda j: sources[j][0], key="tok-metric")
label, rec, name = sources[i]
arrays = data.load_arrays(roots.results, rec["rel"])
values = data.per_token_metrics(arrays, len(rec["layers"]))[name]  # (layer, token)
index = data.token_index(arrays)
texts = data.token_texts(roots, rec, arrays, index)
order = np.argsort(index, kind="stable")  # corpus order
layer = ui.layer_slider(rec["layers"], key="tok-layer")
li = [int(l) for l in rec["layers"]].index(int(layer))
n = len(order)
start = 0
if n > WINDOW:
    start = st.number_input(f"first token (of {n})", 0, n - 1, 0, step=WINDOW, key="tok-start")
shown = order[start:start + WINDOW]
row = values[li]
finite = row[np.isfinite(row)]
lo, hi = (np.percentile(finite, [2, 98]) if finite.size else (0.0, 1.0))
scale = (hi - lo) or 1.0

spans = []
for j in shown:
    v = row[j]
    a = 0.0 if not np.isfinite(v) else float(np.clip((v - lo) / scale, 0, 1))
    tip = f"{str(texts[j])!r} row {index[j]}: {v:.4g}"
    spans.append(f"<span title='{html.escape(tip)}' style='background:rgba(220,50,32,{a:.2f});"
                 f"padding:1px 0;border-radius:2px'>{html.escape(texts[j]).replace(' ', '&nbsp;')}</span>")
st.caption(f"{name} at layer {layer}: white = {lo:.3g}, red = {hi:.3g} (2nd–98th percentile)")
st.markdown("<div style='line-height:1.9;font-family:monospace;white-space:pre-wrap' data-testid='lens-tokens'>"
            + "".join(spans) + "</div>", unsafe_allow_html=True)

pick = st.selectbox("token", shown, format_func=lambda j: f"{index[j]}: {str(texts[j])!r}", key="tok-pick")
fig = go.Figure(go.Scatter(x=rec["layers"], y=values[:, pick], mode="lines+markers", name=name))
fig.update_layout(title=f"{name} of {str(texts[pick])!r} through the layers", xaxis_title="layer", height=320,
                  margin=dict(l=40, r=20, t=50, b=40))
st.plotly_chart(fig, key="tok-trace")

# logit-lens top-k of this token through the layers, when a logit-lens result saved it
lens_runs = [r for r in found if r["study"] in ("logit-lens", "tuned-lens") and r["run"] == rec["run"]]
shown_topk = False
for lr in lens_runs:
    la = data.load_arrays(roots.results, lr["rel"])
    key = next((k for k in ("topk_tokens", "top_tokens", "topk_token") if k in la), None)
    lidx = data.token_index(la)
    if key is None or lidx is None:
        continue
    where = np.nonzero(lidx == index[pick])[0]
    if not where.size:
        continue
    topk = la[key]  # (layer, token, k)
    probs = la.get("topk_probs")
    table = []
    for l_i, l in enumerate(lr["layers"]):
        cells = [str(t) for t in topk[l_i, where[0]]]
        if probs is not None:
            cells = [f"{t} ({p:.2f})" for t, p in zip(cells, probs[l_i, where[0]])]
        table.append({"layer": l, **{f"top{k + 1}": c for k, c in enumerate(cells)}})
    st.subheader(f"{lr['study']} top-k for {str(texts[pick])!r}")
    st.dataframe(table, hide_index=True)
    shown_topk = True
if not shown_topk:
    st.caption("logit-lens top-k per token appears here once a logit-lens result with `topk_tokens` is in this run "
               "(`lens study logit-lens ...`); the Live page computes it for your own text.")
