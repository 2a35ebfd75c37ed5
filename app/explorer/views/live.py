"""Live: type a text, run a (cached) model, see its logit lens and per-token metrics."""

import html

import numpy as np
import plotly.graph_objects as go
import streamlit as st

import lens
from app.explorer import data, ui
from app.explorer.live import logit_lens
from lens.model.loading import list_models

st.title("Live")
st.caption("The only page that runs a model: loaded once per server process (`st.cache_resource`).")


@st.cache_resource(show_spinner="loading model…", max_entries=2)
def get_model(alias: str):
    return lens.load_model(alias)


@st.cache_data(max_entries=32, show_spinner="running the logit lens…")
def run_lens(alias: str, text: str, k: int) -> dict:
    return logit_lens(get_model(alias), text, k=k)


# Aliases only: a free-form model path would let the page open files outside the configured roots.
aliases = [m["alias"] for m in list_models() if m["installed"]]
seen = [r.record.model for r in data.list_runs(ui.roots().results) if r.record.model in aliases]
default = seen[0] if seen else ("tiny-llama" if "tiny-llama" in aliases else aliases[0])
alias = st.selectbox("model", aliases, index=aliases.index(default), key="live-model")
text = st.text_area("text", "The capital of France is Paris. The capital of Italy is", key="live-text",
                    max_chars=2000)
k = st.slider("top-k", 1, 10, 5, key="live-k")
if st.button("Run", key="live-run", type="primary") or st.session_state.get("live-done"):
    st.session_state["live-done"] = True
    try:
        res = run_lens(alias, text, k)
    except ValueError as exc:
        st.error(str(exc))
        st.stop()
    toks, layers = res["tokens"], [int(l) for l in res["layers"]]
    metric = st.radio("per-token metric", ["loss", "rank", "entropy"], horizontal=True, key="live-metric")
    layer = ui.layer_slider(layers, key="live-layer")
    row = res[metric][layer]
    finite = row[np.isfinite(row)]
    hi = float(np.percentile(finite, 98)) if finite.size else 1.0
    spans = "".join(
        f"<span title='{html.escape(f'{str(t)!r}: {v:.3g}')}' style='background:rgba(220,50,32,"
        f"{0 if not np.isfinite(v) else min(1.0, v / (hi or 1)):.2f})'>{html.escape(t)}</span> "
        for t, v in zip(toks, row))
    st.markdown(f"<div style='font-family:monospace;line-height:1.9'>{spans}</div>", unsafe_allow_html=True)
    top1 = res["topk_tokens"][:, :, 0]
    fig = go.Figure(go.Heatmap(z=res["loss"], x=list(range(len(toks))), y=layers, text=top1,
                               texttemplate="%{text}", colorscale="Reds", colorbar=dict(title="loss (nats)")))
    fig.update_layout(title="Logit lens: top-1 token per layer (colour: loss of the true next token)",
                      xaxis=dict(title="position", tickvals=list(range(len(toks))), ticktext=list(toks)),
                      yaxis_title="layer (output of block l, resid_post)", height=120 + 40 * len(layers))
    st.plotly_chart(fig, key="live-heat")
    pos = st.selectbox("token", range(len(toks)), format_func=lambda j: f"{j}: {str(toks[j])!r}",
                       index=len(toks) - 1, key="live-pos")
    st.dataframe([{"layer": l, **{f"top{j + 1}": f"{res['topk_tokens'][l, pos, j]} ({res['topk_probs'][l, pos, j]:.2f})"
                                  for j in range(res["topk_tokens"].shape[2])}} for l in layers], hide_index=True)
