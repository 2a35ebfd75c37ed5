"""Senses: kNN sense accuracy and cluster agreement per layer; a lemma's contexts in 2-D, by sense."""

import plotly.graph_objects as go
import streamlit as st

from app.explorer import data, links, ui
from studies.senses.declaration import A, M, S

st.title("Senses")
run = ui.pick_result("senses", key="se-run")
if run is not None:
    rec = run.record
    ui.findings(run, key="se-findings")
    s = rec.summary
    ui.show(ui.layer_figure(rec, [M.knn_accuracy, M.ari], "Sense separation per layer",
                            hline={"chance": s.get(S.chance), "most frequent sense": s.get(S.most_frequent_sense)}),
            "se-main")
    arrays = data.load_arrays(ui.roots().results, run.rel)
    # per lemma: A.projection (layer, context, 2), A.projection_senses (context,), A.projection_texts (context,)
    lemmas = [str(l) for l in arrays.get(A.projection_lemmas, []) if A.projection(l) in arrays]
    if not lemmas:
        st.caption(f"no per-context 2-D projections in this result (arrays `{A.projection('<lemma>')}`)")
    else:
        lemmas = sorted(lemmas)
        links.seed("se-lemma", lemmas, links.LEMMA)
        chosen = st.selectbox("lemma", lemmas, key="se-lemma")
        links.remember(links.LEMMA, chosen)
        layer = ui.layer_slider(rec.layers, key="se-layer")
        li = [int(l) for l in rec.layers].index(int(layer))
        P = arrays[A.projection(chosen)]
        senses = arrays[A.projection_senses(chosen)].astype(str)
        texts = arrays.get(A.projection_texts(chosen))
        fig = go.Figure()
        for sv in sorted(set(senses)):
            sel = (senses == sv).nonzero()[0]
            hover = None if texts is None else [str(t)[:120] for t in texts[sel]]
            fig.add_trace(go.Scatter(x=P[li, sel, 0], y=P[li, sel, 1], mode="markers", name=sv,
                                     text=hover, hoverinfo="text+name" if hover else "name"))
        fig.update_layout(title=f"'{chosen}' contexts at layer {layer}, coloured by sense", height=460,
                          xaxis_title="first principal component of the contexts", yaxis_title="second principal component")
        st.plotly_chart(fig, key="se-proj")
    ui.details(run, "se-generic")
