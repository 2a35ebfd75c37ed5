"""Geometry: intrinsic dimension, anisotropy and rogue dimensions, linearity."""

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app.explorer import data, ui
from studies.anisotropy import declaration as anisotropy
from studies.intrinsic_dim import declaration as intrinsic_dim
from studies.linearity import declaration as linearity

st.title("Geometry")
tab_id, tab_an, tab_lin = ui.tabs("geometry")
with tab_id:
    if tab_id.open:
        run = ui.pick_result("intrinsic-dim", key="id-run")
        if run is not None:
            M = intrinsic_dim.M
            ui.findings(run, key="id-findings")
            # the judged profile first: one point per sequence, as the hunchback papers measure it
            ui.show(ui.layer_figure(run.record, [M.seq_twonn, M.seq_twonn_shuffled],
                                    "Intrinsic dimension per layer, one point per sequence (judged)",
                                    band=(M.seq_twonn_low, M.seq_twonn_high)), "id-seq")
            ui.show(ui.layer_figure(run.record, [M.twonn, M.mle, M.twonn_shuffled],
                                    "Intrinsic dimension per layer, every token (ours, not judged)",
                                    band=(M.twonn_low, M.twonn_high)), "id-main")
            ui.details(run, "id-generic")
with tab_an:
    if tab_an.open:
        run = ui.pick_result("anisotropy", key="an-run")
        if run is not None:
            rec, M, A = run.record, anisotropy.M, anisotropy.A
            ui.findings(run, key="an-findings")
            ui.show(ui.layer_figure(rec, [M.mean_cosine, M.top_pc_share, M.self_similarity, M.intra_sentence_similarity,
                                          M.mev, M.mev_centred], "Anisotropy per layer"), "an-main")
            ui.show(ui.layer_figure(rec, [M.rogue_share], "Share of the mean cosine in the top-3 dimensions"), "an-rogue")
            arrays = data.load_arrays(ui.roots().results, run.rel)
            layer = ui.layer_slider(rec.layers, key="an-layer")
            li = [int(l) for l in rec.layers].index(int(layer)) if layer is not None else 0
            if A.cosine_contributions in arrays:
                row = arrays[A.cosine_contributions][li]
                top = np.argsort(-np.abs(row))[:20]
                fig = go.Figure(go.Bar(x=[str(d) for d in top], y=row[top]))
                fig.update_layout(title=f"Per-dimension contribution to the mean cosine, layer {layer}",
                                  xaxis_title="dimension of d_model", yaxis_title="contribution to the mean cosine",
                                  height=360)
                st.plotly_chart(fig, key="an-contrib")
            elif A.rogue_dims in arrays:
                st.write(f"rogue dimensions at layer {layer}: "
                         + ", ".join(str(int(d)) for d in arrays[A.rogue_dims][li]))
            ui.details(run, "an-generic")
with tab_lin:
    if tab_lin.open:
        run = ui.pick_result("linearity", key="lin-run")
        if run is not None:
            rec, M = run.record, linearity.M
            ui.findings(run, key="lin-findings")
            ui.show(ui.layer_figure(rec, [M.linearity, M.linearity_centered], "Linearity of layer l → l+1",
                                    hline={"0.99 (secretly linear)": 0.99}), "lin-main")
            by_class = [m for m in rec.metrics if M.nonlinearity.matches(m)]
            ui.show(ui.layer_figure(rec, [M.nonlinearity_mean] + by_class, "Per-token nonlinearity by token class"),
                    "lin-class")
            top = rec.summary.get(linearity.S.top_nonlinear_tokens)
            if top:
                st.write("most nonlinear token types: " + ", ".join(f"`{t}`" for t in top[:20]))
            ui.details(run, "lin-generic")
