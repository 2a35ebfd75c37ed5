"""Context knobs: filler removal against a random control, original vs transformed corpus, and the
1-D knob between context and prior knowledge with its steering curve."""

import plotly.graph_objects as go
import streamlit as st

from app.explorer import data, ui
from studies.context_knob import declaration as kn
from studies.filler_tokens import declaration as fi

st.title("Context knobs")
tab_f, tab_t, tab_k = ui.tabs("knobs")
with tab_f:
    if tab_f.open:
        run = ui.pick_result("filler-tokens", key="fi-run")
        if run is not None:
            ui.findings(run, key="fi-findings")
            s = run.record.summary
            f, r = s.get(fi.S.delta_loss_filler), s.get(fi.S.delta_loss_random)
            if f is not None and r is not None:
                fig = go.Figure(go.Bar(x=["remove fillers", "remove random tokens"], y=[f, r]))
                fig.update_layout(title="Δ loss after removing tokens", yaxis_title=f"Δ loss ({ui.data.spec(run.record.study).unit(fi.S.delta_loss_filler)})",
                                  height=360)
                st.plotly_chart(fig, key="fi-bar")
            ui.generic_result(run, "fi-generic")
with tab_t:
    if tab_t.open:
        found = data.list_runs(ui.roots().results)

        def transform_of(r):
            t = (r.record.extra or {}).get("transform") or (r.record.config or {}).get("transform")
            return str(t) if t else "original"

        studies = sorted({r.record.study for r in found})
        if not studies:
            ui.missing("filler-tokens")
        else:
            study = st.selectbox("study", studies, key="tr-study")
            mine = [r for r in found if r.record.study == study]
            labels = [f"{transform_of(r)} · {ui.run_label(r)}" for r in mine]
            metrics = sorted({m for r in mine for m in r.record.metrics})
            metric = st.selectbox("metric", metrics, key="tr-metric", format_func=lambda n: ui.label(study, n)) if metrics else None
            picked = st.multiselect("runs (original and transformed)", range(len(mine)),
                                    default=list(range(min(2, len(mine)))), format_func=lambda j: labels[j],
                                    key="tr-runs")
            if metric:
                fig = go.Figure()
                for j in picked:
                    fig.add_trace(go.Scatter(x=mine[j].record.layers, y=ui.metric_values(mine[j].record, metric),
                                             mode="lines+markers", name=labels[j]))
                fig.update_layout(title=f"{study}: {ui.label(study, metric, unit=False)}", xaxis_title=ui.axis_title(study, *(mine[j].record for j in picked)),
                                  yaxis_title=ui.data.spec(study).unit(metric) if ui.data.spec(study) else "", height=440,
                                  legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1.0),
                                  margin=dict(t=90))
                st.plotly_chart(fig, key="tr-plot")
            if len(mine) < 2:
                st.caption("run the study again on a transformed corpus (e.g. `--corpus` with a transform) to compare")
with tab_k:
    if tab_k.open:
        run = ui.pick_result("context-knob", key="kn-run")
        if run is not None:
            rec, A = run.record, kn.A
            ui.findings(run, key="kn-findings")
            s = rec.summary
            ui.show(ui.layer_figure(rec, [kn.M.separation], "Knob separation per layer"), "kn-sep")
            st.write(f"knob layer: **{s.get(kn.S.knob_layer, '—')}**, baseline context share "
                     f"{s.get(kn.S.baseline_context_share, '—')}")
            arrays = data.load_arrays(ui.roots().results, run.rel)
            curves = {"all prompts": A.steer_context_share, "'follow the context'": A.steer_context_share_context_instruction,
                      "'answer from memory'": A.steer_context_share_memory_instruction}
            curves = {label: arrays[k] for label, k in curves.items() if k in arrays}
            if A.steer_values in arrays and curves:
                fig = go.Figure([go.Scatter(x=arrays[A.steer_values], y=y, mode="lines+markers", name=label)
                                 for label, y in curves.items()])
                fig.update_layout(title="Steering curve", xaxis_title="coordinate along the knob",
                                  yaxis_title="share of answers from the context", height=380)
                st.plotly_chart(fig, key="kn-steer")
            else:
                st.caption(f"no steering curve in this result (arrays `{A.steer_values}`, `{A.steer_context_share}`)")
            if A.cad_alpha in arrays and A.cad_context_share in arrays:
                fig = go.Figure(go.Scatter(x=arrays[A.cad_alpha], y=arrays[A.cad_context_share], mode="lines+markers"))
                fig.update_layout(title="Context-aware decoding", xaxis_title="contrast strength α",
                                  yaxis_title="share of answers from the context", height=340)
                st.plotly_chart(fig, key="kn-cad")
            ui.saved_figures(run, "kn-saved")
