"""Layer ablation: retained next-token accuracy when one layer is deleted or two adjacent are swapped."""

import streamlit as st

from app import ui

st.title("Layer ablation")
rec = ui.pick_result("layer-ablation", key="ab-run")
if rec is not None:
    s = rec["summary"]
    c = st.columns(2)
    c[0].metric("retained, min", "—" if s.get("retained_min") is None else f"{s['retained_min']:.1%}")
    c[1].metric("retained, max", "—" if s.get("retained_max") is None else f"{s['retained_max']:.1%}",
                help="seed claim: 72–95% (stages of inference)")
    fig = ui.layer_figure(rec, ["retained_accuracy_delete", "retained_accuracy_swap"],
                          "Retained accuracy per ablated layer", y_title="retained share",
                          hline={"72%": 0.72, "95%": 0.95})
    ui.show(fig, "ab-retained")
    ui.show(ui.layer_figure(rec, ["delta_ce_delete", "delta_ce_swap"], "Δ cross-entropy", y_title="nats"), "ab-ce")
    with st.expander("all metrics, summary and saved figures"):
        ui.generic_result(rec, "ab-generic")
