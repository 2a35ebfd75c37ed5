"""Probes: per-layer linear probes with their control task (accuracy vs selectivity, scalar-mix
weights), and context memory — how much of its prefix a token's state holds, by token class, beside
its correlation with per-token nonlinearity."""

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import ui

CLASS_ORDER = ("punctuation", "determiner", "stopword", "number", "content", "other")
NOT_A_CLASS = ("all", "all_gain", "corr_nonlinearity")

st.title("Probes")
tab_p, tab_c = st.tabs(["linear probes", "context memory"])
with tab_p:
    rec = ui.pick_result("probes", key="pr-run")
    if rec is not None:
        s = rec["summary"]
        ui.show(ui.layer_figure(rec, ["accuracy", "control_accuracy", "selectivity"],
                                f"Probe accuracy per layer (letter {s.get('letter', '?')!r}) — {rec['model']}",
                                y_title="accuracy", hline={"majority class": s.get("majority")}), "pr-acc")
        st.caption("selectivity = accuracy − control accuracy (random labels per token type, Hewitt & Liang "
                   "2019): what the probe reads beyond memorising token identity")
        w = ui.metric_values(rec, "mix_weight")
        if w.size and np.isfinite(w).any():
            fig = go.Figure(go.Bar(x=rec["layers"], y=w))
            fig.update_layout(title=f"Scalar-mix weights (mixed-probe accuracy {s.get('mix_accuracy', '—')})",
                              xaxis_title="layer", yaxis_title="softmax weight", height=320)
            st.plotly_chart(fig, key="pr-mix")
        ui.headline_table(rec)
        with st.expander("summary"):
            ui.summary_table(rec)
        with st.expander("saved figures"):
            ui.saved_figures(rec, "pr-saved")
with tab_c:
    rec = ui.pick_result("context-memory", key="cm-run")
    if rec is not None:
        s = rec["summary"]
        classes = [c for c in rec["metrics"] if c not in NOT_A_CLASS and not c.endswith("_gain")]
        classes.sort(key=lambda c: CLASS_ORDER.index(c) if c in CLASS_ORDER else len(CLASS_ORDER))
        gain = st.toggle("gain over the embedding baseline", key="cm-gain",
                         value=False, disabled=not any(f"{c}_gain" in rec["metrics"] for c in classes))
        names = [f"{c}_gain" if gain and f"{c}_gain" in rec["metrics"] else c for c in classes + ["all"]]
        ui.show(ui.layer_figure(rec, names, f"Context memory by token class — {rec['model']}",
                                y_title="held-out R² of the previous tokens"), "cm-lines")
        layer = ui.layer_slider(rec["layers"], key="cm-layer")
        if layer is not None:
            i = [int(l) for l in rec["layers"]].index(layer)
            vals = {n: ui.metric_values(rec, n)[i] for n in names if n != "all"}
            vals = {n: v for n, v in vals.items() if np.isfinite(v)}
            if vals:
                order = sorted(vals, key=vals.get, reverse=True)
                fig = go.Figure(go.Bar(x=order, y=[vals[n] for n in order]))
                fig.update_layout(title=f"Layer {layer}: token classes ranked", yaxis_title="score", height=320)
                st.plotly_chart(fig, key="cm-bar")
        ui.show(ui.layer_figure(rec, ["corr_nonlinearity"], "Spearman ρ: context memory vs nonlinearity (layer → layer+1)",
                                hline={"0": 0.0}), "cm-corr")
        st.write(f"top class: **{s.get('top_class', '—')}**; mean correlation with nonlinearity: "
                 f"**{s.get('corr_with_nonlinearity', '—')}**")
        ui.headline_table(rec)
        with st.expander("summary"):
            ui.summary_table(rec)
        with st.expander("saved figures"):
            ui.saved_figures(rec, "cm-saved")
