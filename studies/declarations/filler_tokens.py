"""What the filler tokens study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies.headlines import pair
from studies.contract import Headline, Names, ResultSpec, array, scalar

S = Names(
    scalar("loss_original", "loss of the common tokens in the original text, nats/token"),
    scalar("loss_filler", "their loss with filler tokens removed"),
    scalar("loss_random", "their loss with as many random tokens removed (mean over draws)"),
    scalar("delta_loss_filler", "loss_filler − loss_original"),
    scalar("delta_loss_random", "loss_random − loss_original"),
    scalar("delta_loss_filler_ci_low", "bootstrap interval over chunks of delta_loss_filler, low"),
    scalar("delta_loss_filler_ci_high", "bootstrap interval of delta_loss_filler, high"),
    scalar("delta_loss_random_ci_low", "bootstrap interval over chunks of delta_loss_random, low"),
    scalar("delta_loss_random_ci_high", "bootstrap interval of delta_loss_random, high"),
    scalar("filler_minus_random", "delta_loss_filler − delta_loss_random"),
    scalar("n_scored", "tokens scored (kept by both removals)"),
    scalar("n_chunks", "chunks of seq_len tokens"),
    scalar("removed_share", "share of tokens removed as filler"),
    scalar("precision", "arithmetic of the forward passes (lens.runtime.precision)"),
    scalar("loss_all_{}", "mean loss over all remaining tokens of a condition (the composition effect)",
           attr="loss_all"),
)
A = Names(
    array("chunk_delta_filler", "draw", "mean loss change per chunk and random draw (its common tokens), "
                                        "filler removed"),
    array("chunk_delta_random", "draw", "mean loss change per chunk and random draw, random tokens removed"),
)

RESULT = ResultSpec(summary=S, arrays=A, layer_axis="none (no per-layer metrics)")
HEADLINES = (Headline("Δ loss removing fillers vs random", pair(S.delta_loss_filler, S.delta_loss_random),
                        "fillers matter more than random tokens (LLM-Microscope)"),)
CLAIMS = ()
