"""Logit lens and tuned lens: cross-entropy, KL to the final layer, agreement, entropy, rank per layer."""

import streamlit as st

from app import ui
from studies import logit_lens as ll
from studies import tuned_lens as tl

st.title("Logit / tuned lens")
tab_ll, tab_tl = st.tabs(["logit lens", "tuned lens"])
with tab_ll:
    run = ui.pick_result("logit-lens", key="ll-run")
    if run is not None:
        rec, M = run.record, ll.M
        d = rec.summary.get(ll.S.last_layer_max_abs_logit_diff)
        st.metric("max |logit diff| of the last layer vs the model", "—" if d is None else f"{d:.2e}",
                  help="0 expected: the last layer's lens is the model's own output")
        ui.show(ui.layer_figure(rec, [M.ce, M.entropy], "Cross-entropy to the next token, entropy",
                                band=(M.ce_low, M.ce_high), y_title="nats"), "ll-ce")
        ui.show(ui.layer_figure(rec, [M.kl_to_final], "KL to the final layer", y_title="nats"), "ll-kl")
        ui.show(ui.layer_figure(rec, [M.top1_agreement], "Top-1 agreement with the final layer"), "ll-agree")
        ui.show(ui.layer_figure(rec, [M.median_rank], "Median rank of the true token", log_y=True), "ll-rank")
        with st.expander("all metrics, summary and saved figures"):
            ui.generic_result(run, "ll-generic")
with tab_tl:
    run = ui.pick_result("tuned-lens", key="tl-run")
    if run is not None:
        rec, M = run.record, tl.M
        ui.show(ui.layer_figure(rec, [M.ce, M.logit_lens_ce], "Tuned lens vs logit lens: cross-entropy",
                                y_title="nats"), "tl-ce")
        ui.show(ui.layer_figure(rec, [M.kl_to_final], "Tuned lens: KL to the final layer", y_title="nats"), "tl-kl")
        with st.expander("all metrics, summary and saved figures"):
            ui.generic_result(run, "tl-generic")
