"""Layer ablation: retained next-token accuracy when one layer is deleted or two adjacent are swapped."""

import streamlit as st

from app.explorer import ui
from studies.layer_ablation.declaration import M, S

st.title("Layer ablation")
run = ui.pick_result("layer-ablation", key="ab-run")
if run is not None:
    rec = run.record
    ui.findings(run, key="ab-findings")
    s = rec.summary
    c = st.columns(2)
    c[0].metric(ui.label(rec.study, S.retained_min, unit=False), "—" if s.get(S.retained_min) is None else f"{s[S.retained_min]:.1%}")
    c[1].metric(ui.label(rec.study, S.retained_max, unit=False), "—" if s.get(S.retained_max) is None else f"{s[S.retained_max]:.1%}",
                help="seed claim: 72–95% (stages of inference)")
    fig = ui.layer_figure(rec, [M.retained_accuracy_delete, M.retained_accuracy_swap],
                          "Retained accuracy per ablated layer",
                          hline={"72%": 0.72, "95%": 0.95})
    ui.show(fig, "ab-retained")
    ui.show(ui.layer_figure(rec, [M.delta_ce_delete, M.delta_ce_swap], "Δ cross-entropy"), "ab-ce")
    ui.details(run, "ab-generic")
