"""Geometry: intrinsic dimension, anisotropy and rogue dimensions, linearity."""

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import data, ui

st.title("Geometry")
tab_id, tab_an, tab_lin = st.tabs(["intrinsic dimension", "anisotropy & rogue dims", "linearity"])
with tab_id:
    rec = ui.pick_result("intrinsic-dim", key="id-run")
    if rec is not None:
        ui.show(ui.layer_figure(rec, ["twonn", "mle", "twonn_shuffled"], "Intrinsic dimension per layer",
                                band=("twonn_low", "twonn_high"), y_title="dimension"), "id-main")
        with st.expander("all metrics, summary and saved figures"):
            ui.generic_result(rec, "id-generic")
with tab_an:
    rec = ui.pick_result("anisotropy", key="an-run")
    if rec is not None:
        ui.show(ui.layer_figure(rec, ["mean_cosine", "top_pc_share", "self_similarity",
                                      "intra_sentence_similarity", "mev"], "Anisotropy per layer"), "an-main")
        ui.show(ui.layer_figure(rec, ["rogue_share"], "Share of the mean cosine in the top-3 dimensions"), "an-rogue")
        arrays = data.load_arrays(ui.roots().results, rec["rel"])
        layer = ui.layer_slider(rec["layers"], key="an-layer")
        li = [int(l) for l in rec["layers"]].index(int(layer)) if layer is not None else 0
        contrib = next((arrays[k] for k in ("cosine_contributions", "dim_contribution", "cosine_contribution")
                        if k in arrays and arrays[k].ndim == 2 and arrays[k].shape[0] == len(rec["layers"])), None)
        if contrib is not None:
            row = contrib[li]
            top = np.argsort(-np.abs(row))[:20]
            fig = go.Figure(go.Bar(x=[str(d) for d in top], y=row[top]))
            fig.update_layout(title=f"Per-dimension contribution to the mean cosine, layer {layer}",
                              xaxis_title="dimension", height=360)
            st.plotly_chart(fig, key="an-contrib")
        elif "rogue_dims" in arrays and arrays["rogue_dims"].ndim == 2:
            st.write(f"rogue dimensions at layer {layer}: "
                     + ", ".join(str(int(d)) for d in arrays["rogue_dims"][li]))
        elif "rogue_dims" in rec["metrics"]:
            st.write(f"rogue dimensions at layer {layer}: {rec['metrics']['rogue_dims'][li]}")
        with st.expander("all metrics, summary and saved figures"):
            ui.generic_result(rec, "an-generic")
with tab_lin:
    rec = ui.pick_result("linearity", key="lin-run")
    if rec is not None:
        ui.show(ui.layer_figure(rec, ["linearity", "linearity_centered"], "Linearity of layer l → l+1",
                                y_title="score", hline={"0.99 (secretly linear)": 0.99}), "lin-main")
        by_class = [m for m in rec["metrics"] if m.startswith("nonlinearity__")]
        ui.show(ui.layer_figure(rec, ["nonlinearity_mean"] + by_class, "Per-token nonlinearity by token class"),
                "lin-class")
        top = rec["summary"].get("top_nonlinear_tokens")
        if top:
            st.write("most nonlinear token types: " + ", ".join(f"`{t}`" for t in top[:20]))
        with st.expander("all metrics, summary and saved figures"):
            ui.generic_result(rec, "lin-generic")
