"""Prediction gains: log prediction residual per layer (He & Su 2024's equi-learning law)."""

import streamlit as st

from app.explorer import data, ui
from app.explorer.depth import depth_beside_gains, matching_depth_use
from studies.prediction_gains.declaration import M, S

st.title("Prediction gains")
run = ui.pick_result("prediction-gains", key="pg-run")
if run is not None:
    rec = run.record
    ui.findings(run, key="pg-findings")
    s = rec.summary
    cols = st.columns(4)
    # the judged number first: the paper's recipe (in-sample least squares of the next token's id); ours beside it
    for col, key, note in ((cols[0], S.pearson_r_token_id, "the paper's recipe; seed claim: −0.983 … −0.997"),
                           (cols[3], S.pearson_r, "ours (held-out one-hot ridge): not the paper's statistic")):
        r = s.get(key)
        col.metric(ui.label(rec.study, key), "—" if r is None else f"{r:.3f}", help=note)
    cols[1].metric(ui.label(rec.study, S.decay_ratio), f"{s[S.decay_ratio]:.3g}" if s.get(S.decay_ratio) is not None else "—")
    cols[2].metric(ui.label(rec.study, S.slope_log10), f"{s[S.slope_log10]:.4f}" if s.get(S.slope_log10) is not None else "—")
    shown = [M.pr, M.pr_in_sample, M.pr_token_id]
    ui.show(ui.layer_figure(rec, shown, "Prediction residual per layer", log_y=True, band=(M.pr_low, M.pr_high)), "pg-main")
    # Csordás et al. (2025) beside He & Su: the same model's depth-use result on the block axis
    st.subheader("Depth use beside prediction gains")
    du = matching_depth_use(rec, data.runs_of(ui.roots().results, "depth-use"))
    ui.show(depth_beside_gains(rec, None if du is None else du.record), "pg-depth")
    if du is not None:
        ui.findings(du, key="pg-depth-findings")
    others = [m for m in rec.metrics if m not in shown + [M.pr_low, M.pr_high]]
    if others:
        ui.show(ui.layer_figure(rec, others, "Other per-layer measures"), "pg-other")
    ui.headline_table(rec)
    with st.expander("summary"):
        ui.summary_table(rec)
    ui.figures_box(run, "pg-saved")
