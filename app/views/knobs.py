"""Context knobs: filler removal against a random control, original vs transformed corpus, and the
1-D knob between context and prior knowledge with its steering curve."""

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import data, ui

STEER_X = ("steer_values", "steer_alpha")
STEER_Y = {"steer_context_share": "plain prompt", "steer_context_share_context_instruction": "'follow the context'",
           "steer_context_share_memory_instruction": "'answer from memory'"}

st.title("Context knobs")
tab_f, tab_t, tab_k = st.tabs(["filler tokens", "original vs transformed", "context knob"])
with tab_f:
    rec = ui.pick_result("filler-tokens", key="fi-run")
    if rec is not None:
        s = rec["summary"]
        f, r = s.get("delta_loss_filler"), s.get("delta_loss_random")
        if f is not None and r is not None:
            fig = go.Figure(go.Bar(x=["remove fillers", "remove random tokens"], y=[f, r]))
            fig.update_layout(title="Δ loss after removing tokens", yaxis_title="nats", height=360)
            st.plotly_chart(fig, key="fi-bar")
        ui.generic_result(rec, "fi-generic")
with tab_t:
    found = data.list_runs(ui.roots().results)

    def transform_of(r):
        t = (r.get("extra") or {}).get("transform") or (r.get("config") or {}).get("transform")
        return str(t) if t else "original"

    studies = sorted({r["study"] for r in found})
    if not studies:
        ui.missing("filler-tokens")
    else:
        study = st.selectbox("study", studies, key="tr-study")
        mine = [r for r in found if r["study"] == study]
        labels = [f"{transform_of(r)} · {ui.run_label(r)}" for r in mine]
        metrics = sorted({m for r in mine for m in r["metrics"]})
        metric = st.selectbox("metric", metrics, key="tr-metric") if metrics else None
        picked = st.multiselect("runs (original and transformed)", range(len(mine)),
                                default=list(range(min(2, len(mine)))), format_func=lambda j: labels[j],
                                key="tr-runs")
        if metric:
            fig = go.Figure()
            for j in picked:
                fig.add_trace(go.Scatter(x=mine[j]["layers"], y=ui.metric_values(mine[j], metric),
                                         mode="lines+markers", name=labels[j]))
            fig.update_layout(title=f"{study}: {metric}", xaxis_title="layer", height=400)
            st.plotly_chart(fig, key="tr-plot")
        if len(mine) < 2:
            st.caption("run the study again on a transformed corpus (e.g. `--corpus` with a transform) to compare")
with tab_k:
    rec = ui.pick_result("context-knob", key="kn-run")
    if rec is not None:
        s = rec["summary"]
        ui.show(ui.layer_figure(rec, ["separation"], "Knob separation per layer",
                                hline={"knob layer": None}), "kn-sep")
        st.write(f"knob layer: **{s.get('knob_layer', '—')}**, baseline context share "
                 f"{s.get('baseline_context_share', '—')}")
        arrays = data.load_arrays(ui.roots().results, rec["rel"])
        x = next((arrays[k] for k in STEER_X if k in arrays and arrays[k].ndim == 1), None)
        curves = {label: arrays[k] for k, label in STEER_Y.items()
                  if k in arrays and x is not None and arrays[k].shape == x.shape}
        if curves:
            fig = go.Figure([go.Scatter(x=x, y=y, mode="lines+markers", name=label) for label, y in curves.items()])
            fig.update_layout(title="Steering curve", xaxis_title="steering strength along the knob",
                              yaxis_title="share of answers from the context", height=380)
            st.plotly_chart(fig, key="kn-steer")
        else:
            st.caption("no steering curve in this result (arrays `steer_values`, `steer_context_share`)")
        if "cad_alpha" in arrays and "cad_context_share" in arrays:
            fig = go.Figure(go.Scatter(x=arrays["cad_alpha"], y=arrays["cad_context_share"], mode="lines+markers"))
            fig.update_layout(title="Context-aware decoding", xaxis_title="contrast strength α",
                              yaxis_title="share of answers from the context", height=340)
            st.plotly_chart(fig, key="kn-cad")
        ui.saved_figures(rec, "kn-saved")
