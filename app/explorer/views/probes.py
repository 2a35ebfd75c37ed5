"""Probes: per-layer linear probes with their control task (accuracy vs selectivity, scalar-mix
weights), and context memory — how much of its prefix a token's state holds, by token class, beside
its correlation with per-token nonlinearity."""

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app.explorer import data, ui
from lens.text.token_classes import TOKEN_CLASSES
from studies.context_memory import declaration as cm
from studies.probes_study import declaration as pr

st.title("Probes")
tab_p, tab_c = ui.tabs("probes")
with tab_p:
    if tab_p.open:
        run = ui.pick_result("probes", key="pr-run")
        if run is not None:
            rec, M, S = run.record, pr.M, pr.S
            ui.findings(run, key="pr-findings")
            s = rec.summary
            ui.show(ui.layer_figure(rec, [M.accuracy, M.control_accuracy, M.selectivity],
                                    f"Probe accuracy per layer (letter {s.get(S.letter, '?')!r}) — {rec.model}",
                                    hline={"majority class": s.get(S.majority)}), "pr-acc")
            st.caption("selectivity = accuracy − control accuracy (random labels per token type, Hewitt & Liang "
                       "2019): what the probe reads beyond memorising token identity")
            w = ui.metric_values(rec, M.mix_weight)
            if w.size and np.isfinite(w).any():
                fig = go.Figure(go.Bar(x=rec.layers, y=w))
                fig.update_layout(title=f"Scalar-mix weights (mixed-probe accuracy {s.get(S.mix_accuracy, '—')})",
                                  xaxis_title=ui.axis_title(rec.study, rec), yaxis_title=ui.label(rec.study, M.mix_weight), height=320)
                st.plotly_chart(fig, key="pr-mix")
            ui.headline_table(rec)
            with st.expander("summary"):
                ui.summary_table(rec)
            ui.figures_box(run, "pr-saved")
with tab_c:
    if tab_c.open:
        run = ui.pick_result("context-memory", key="cm-run")
        if run is not None:
            rec, M, S, A = run.record, cm.M, cm.S, cm.A
            ui.findings(run, key="cm-findings")
            s = rec.summary
            arrays = data.load_arrays(ui.roots().results, run.rel)
            gain = st.toggle("gain over the embedding baseline", key="cm-gain", value=False,
                             disabled=A.gain_by_class not in arrays)
            if gain:  # (layer, class) gains over the token's own embedding, in the study's class order
                series = {str(c): arrays[A.gain_by_class][:, j] for j, c in enumerate(arrays[A.classes])}
                series["all"] = ui.metric_values(rec, M.all_gain)
            else:
                series = {c: ui.metric_values(rec, c) for c in TOKEN_CLASSES if c in rec.metrics}
                series["all"] = ui.metric_values(rec, M.all)
            fig = go.Figure([go.Scatter(x=rec.layers, y=v, mode="lines+markers", name=n) for n, v in series.items()])
            fig.update_layout(title=f"Context memory by token class — {rec.model}" + (" (gain)" if gain else ""),
                              xaxis_title=ui.axis_title(rec.study, rec), yaxis_title="held-out R² of the previous tokens", height=420)
            st.plotly_chart(fig, key="cm-lines")
            layer = ui.layer_slider(rec.layers, key="cm-layer")
            if layer is not None:
                i = [int(l) for l in rec.layers].index(layer)
                vals = {n: v[i] for n, v in series.items() if n != "all" and len(v) > i and np.isfinite(v[i])}
                if vals:
                    order = sorted(vals, key=vals.get, reverse=True)
                    fig = go.Figure(go.Bar(x=order, y=[vals[n] for n in order]))
                    fig.update_layout(title=f"Layer {layer}: token classes ranked", yaxis_title="score", height=320)
                    st.plotly_chart(fig, key="cm-bar")
            ui.show(ui.layer_figure(rec, [M.corr_nonlinearity],
                                    "Spearman ρ: context memory vs nonlinearity (layer → layer+1)", hline={"0": 0.0}),
                    "cm-corr")
            st.write(f"top class: **{s.get(S.top_class, '—')}**; mean correlation with nonlinearity: "
                     f"**{s.get(S.corr_with_nonlinearity, '—')}**")
            ui.headline_table(rec)
            with st.expander("summary"):
                ui.summary_table(rec)
            ui.figures_box(run, "cm-saved")
