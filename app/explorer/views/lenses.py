"""Logit, tuned and Jacobian lenses: cross-entropy, KL to the final layer, agreement, entropy, rank per layer, and
for a corpus result the token × layer grid of top predictions (app/explorer/grid.py: saved arrays only)."""

import streamlit as st

from app.explorer import data, grid, links, ui
from studies.logit_lens import declaration as ll
from studies.tuned_lens import declaration as tl

# positions shown at first: about what a wide page shows without scrolling (40 columns were twice that, half
# of the cells drawn off screen on every switch); the slider widens it to the whole window
GRID_POSITIONS = 24
POSITIONS_KEY = "ll-grid-pos"


@st.fragment  # a switch of lens, window or positions reruns the grid alone (its colour switch: not even that)
def lens_grid(run) -> None:
    rec = run.record
    arrays = data.load_arrays(ui.roots().results, run.rel)
    st.subheader("Token × layer grid", anchor="grid")
    available = grid.lenses(arrays)
    wins = grid.windows(arrays)
    if not available or not wins:
        st.caption("this result saved no per-token predictions for the grid: re-run `lens study logit-lens ...`")
        return
    c1, c3 = st.columns([2, 3])
    lens = c1.radio("lens", available, format_func=lambda k: grid.LENSES[k].title, key="ll-grid-lens")
    # one positions slider for every window (its key alone is its identity, whatever its range): a new
    # window resets it to the first positions instead of mounting another slider (a window change is one
    # element update less in the page)
    w = c3.selectbox("document / window", range(len(wins)), key="ll-grid-window",
                     on_change=lambda: st.session_state.pop(POSITIONS_KEY, None),
                     format_func=lambda j: f"document {wins[j]['doc']} · window {wins[j]['window']} · "
                                           f"{wins[j]['stop'] - wins[j]['start']} tokens")
    win = wins[w or 0]
    n = win["stop"] - win["start"]
    lo, hi = (0, 0) if n == 1 else c3.slider("positions", 0, n - 1, (0, min(n, GRID_POSITIONS) - 1),
                                             key=POSITIONS_KEY)
    # every colour the result saved, cross-entropy first: the switch above the grid repaints it in the page
    grids = [grid.build_grid(arrays, rec.layers, lens=lens, colour=colour, start=win["start"] + lo,
                             stop=win["start"] + hi + 1) for colour in grid.colours(arrays, lens)]
    st.caption(f"cell: the lens' top-1 token · colour: the measure picked above the grid, light = low, dark = high "
               f"(2nd–98th percentile) · rows: {ll.RESULT.axis(rec).title} · hover: top-k with probabilities · "
               "click: that token at that layer in the Token view (coloured by the measure picked)")
    # our own script over our own arrays (texts JSON-escaped, see app/explorer/grid.py): the table is drawn in the page
    st.html(grid.grid_html(grids, lambda layer, row, array: links.token_view_url(
        run.run, layer, row, links.metric_id(rec.study, array))), unsafe_allow_javascript=True)


st.title("Logit / tuned lens")
# the grid first, outside the tabs (the view lens tools open with; a tab panel re-scans its content for
# focusable elements on every change inside it, and the grid is hundreds of links)
run = ui.pick_result("logit-lens", key="ll-run")
if run is not None:
    lens_grid(run)
tab_ll, tab_tl = ui.tabs("lenses")
with tab_ll:
    if tab_ll.open and run is not None:
        rec, M = run.record, ll.M
        ui.findings(run, key="ll-findings")
        d = rec.summary.get(ll.S.last_layer_max_abs_logit_diff)
        st.metric(ll.RESULT.label(ll.S.last_layer_max_abs_logit_diff), "—" if d is None else f"{d:.2e}",
                  help="0 expected: the last layer's lens is the model's own output")
        ui.show(ui.layer_figure(rec, [M.ce, M.entropy], "Cross-entropy to the next token, entropy",
                                band=(M.ce_low, M.ce_high)), "ll-ce")
        ui.show(ui.layer_figure(rec, [M.kl_to_final], "KL to the final layer"), "ll-kl")
        # a run given a fitted Jacobian lens (--param jacobian_lens=FILE) decoded it on the same tokens
        ui.show(ui.layer_figure(rec, [M.ce, M.jacobian_ce] if M.jacobian_ce in rec.metrics else [],
                                "Logit lens vs Jacobian lens: cross-entropy"), "ll-jac")
        ui.show(ui.layer_figure(rec, [M.top1_agreement], "Top-1 agreement with the final layer"), "ll-agree")
        ui.show(ui.layer_figure(rec, [M.median_rank], "Median rank of the true token", log_y=True), "ll-rank")
        ui.details(run, "ll-generic")
with tab_tl:
    if tab_tl.open:
        run = ui.pick_result("tuned-lens", key="tl-run")
        if run is not None:
            rec, M = run.record, tl.M
            ui.findings(run, key="tl-findings")
            # the Jacobian lens (Gurnee et al. 2026) is the third lens of the same run, on the same held-out tokens
            ui.show(ui.layer_figure(rec, [M.ce, M.jacobian_lens_ce, M.logit_lens_ce],
                                    "Tuned, Jacobian and logit lenses: cross-entropy"), "tl-ce")
            ui.show(ui.layer_figure(rec, [M.kl_to_final, M.jacobian_lens_kl, M.logit_lens_kl],
                                    "KL to the final layer"), "tl-kl")
            ui.show(ui.layer_figure(rec, [M.top1_agreement, M.jacobian_lens_top1_agreement,
                                          M.logit_lens_top1_agreement], "Top-1 agreement with the model"), "tl-top1")
            ui.show(ui.layer_figure(rec, [M.jacobian_half_top1_agreement, M.jacobian_half_rel_diff],
                                    "Jacobian lens: two half-fits compared (convergence)", y_title="share / ratio"),
                    "tl-jhalf")
            note = rec.summary.get(tl.S.jacobian_note)
            if note:
                st.caption(f"Jacobian lens: {note}")
            st.caption("the token × layer grid above is the logit lens': the tuned-lens study saves no per-token top-k")
            ui.details(run, "tl-generic")
