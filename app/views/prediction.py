"""Prediction gains: log prediction residual per layer (He & Su 2024's equi-learning law)."""

import streamlit as st

from app import ui

st.title("Prediction gains")
rec = ui.pick_result("prediction-gains", key="pg-run")
if rec is not None:
    s = rec["summary"]
    cols = st.columns(3)
    r = s.get("pearson_r")
    cols[0].metric("Pearson r (held-out)", "—" if r is None else f"{r:.3f}", help="seed claim: −0.983 … −0.997")
    cols[1].metric("decay ratio", f"{s['decay_ratio']:.3g}" if s.get("decay_ratio") is not None else "—")
    cols[2].metric("slope log10 PR / layer", f"{s['slope_log10']:.4f}" if s.get("slope_log10") is not None else "—")
    ui.show(ui.layer_figure(rec, ["pr", "pr_in_sample", "pr_token_id"], "Prediction residual per layer",
                            log_y=True, band=("pr_low", "pr_high"), y_title="PR (log scale)"), "pg-main")
    others = [m for m in rec["metrics"] if m not in ("pr", "pr_low", "pr_high", "pr_in_sample", "pr_token_id")]
    if others:
        ui.show(ui.layer_figure(rec, others, "Other per-layer measures"), "pg-other")
    ui.headline_table(rec)
    with st.expander("summary"):
        ui.summary_table(rec)
    with st.expander("saved figures"):
        ui.saved_figures(rec, "pg-saved")
