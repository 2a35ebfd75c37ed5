"""Senses: kNN sense accuracy and cluster agreement per layer; a lemma's contexts in 2-D, by sense."""

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import data, ui

# (layer, context, 2) projection and per-context labels, under the names the sense study may use
PROJ_KEYS = ("projection", "proj_2d", "points_2d")
LEMMA_KEYS = ("context_lemma", "lemma", "lemmas")
SENSE_KEYS = ("context_sense", "sense", "senses")

st.title("Senses")
rec = ui.pick_result("senses", key="se-run")
if rec is not None:
    s = rec["summary"]
    ui.show(ui.layer_figure(rec, ["knn_accuracy", "ari"], "Sense separation per layer",
                            hline={"chance": s.get("chance"), "most frequent sense": s.get("most_frequent_sense")}),
            "se-main")
    arrays = data.load_arrays(ui.roots().results, rec["rel"])
    proj = next((arrays[k] for k in PROJ_KEYS if k in arrays and arrays[k].ndim == 3), None)
    lemma = next((arrays[k] for k in LEMMA_KEYS if k in arrays and arrays[k].ndim == 1), None)
    sense = next((arrays[k] for k in SENSE_KEYS if k in arrays and arrays[k].ndim == 1), None)
    if proj is None or lemma is None or sense is None or proj.shape[1] != len(lemma):
        st.caption("no per-context 2-D projections in this result (arrays `projection` (layer, context, 2), "
                   "`context_lemma`, `context_sense`)")
    else:
        lemmas = sorted(set(lemma.astype(str)))
        chosen = st.selectbox("lemma", lemmas, key="se-lemma")
        layer = ui.layer_slider(rec["layers"], key="se-layer")
        li = [int(l) for l in rec["layers"]].index(int(layer))
        rows = np.nonzero(lemma.astype(str) == chosen)[0]
        fig = go.Figure()
        for sv in sorted(set(sense[rows].astype(str))):
            sel = rows[sense[rows].astype(str) == sv]
            fig.add_trace(go.Scatter(x=proj[li, sel, 0], y=proj[li, sel, 1], mode="markers", name=sv))
        fig.update_layout(title=f"'{chosen}' contexts at layer {layer}, coloured by sense", height=460)
        st.plotly_chart(fig, key="se-proj")
    with st.expander("all metrics, summary and saved figures"):
        ui.generic_result(rec, "se-generic")
