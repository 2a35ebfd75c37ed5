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
    # the sense study's layout: proj__<lemma> (layer, context, 2), proj_senses__<lemma>, proj_texts__<lemma>
    per_lemma = {k[len("proj__"):]: k for k in arrays if k.startswith("proj__") and arrays[k].ndim == 3}
    proj = next((arrays[k] for k in PROJ_KEYS if k in arrays and arrays[k].ndim == 3), None)
    lemma = next((arrays[k] for k in LEMMA_KEYS if k in arrays and arrays[k].ndim == 1), None)
    sense = next((arrays[k] for k in SENSE_KEYS if k in arrays and arrays[k].ndim == 1), None)
    if proj is not None and lemma is not None and sense is not None and proj.shape[1] == len(lemma):
        for lem in sorted(set(lemma.astype(str))):  # one flat table of contexts: split it per lemma
            rows = np.nonzero(lemma.astype(str) == lem)[0]
            per_lemma[lem] = (proj[:, rows], sense[rows], None)
    for lem, key in list(per_lemma.items()):
        if isinstance(key, str):
            per_lemma[lem] = (arrays[key], arrays.get(f"proj_senses__{lem}"), arrays.get(f"proj_texts__{lem}"))
    if not per_lemma:
        st.caption("no per-context 2-D projections in this result (arrays `proj__<lemma>` (layer, context, 2) "
                   "with `proj_senses__<lemma>`)")
    else:
        chosen = st.selectbox("lemma", sorted(per_lemma), key="se-lemma")
        layer = ui.layer_slider(rec["layers"], key="se-layer")
        li = [int(l) for l in rec["layers"]].index(int(layer))
        P, senses, texts = per_lemma[chosen]
        senses = np.zeros(P.shape[1], dtype=str) if senses is None else senses.astype(str)
        fig = go.Figure()
        for sv in sorted(set(senses)):
            sel = np.nonzero(senses == sv)[0]
            hover = None if texts is None else [str(t)[:120] for t in texts[sel]]
            fig.add_trace(go.Scatter(x=P[li, sel, 0], y=P[li, sel, 1], mode="markers", name=sv,
                                     text=hover, hoverinfo="text+name" if hover else "name"))
        fig.update_layout(title=f"'{chosen}' contexts at layer {layer}, coloured by sense", height=460)
        st.plotly_chart(fig, key="se-proj")
    with st.expander("all metrics, summary and saved figures"):
        ui.generic_result(rec, "se-generic")
