"""What the layer ablation study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import Headline, Names, ResultSpec, array, metric, scalar

_SCANS = {  # lens.interventions.ablation.AblationResult field -> what it is
    "retained_accuracy_delete": "top-1 accuracy with block l deleted, over the intact model's",
    "retained_accuracy_swap": "top-1 accuracy with blocks l, l+1 swapped, over the intact model's",
    "delta_ce_delete": "cross-entropy with block l deleted − intact, nats/token",
    "delta_ce_swap": "cross-entropy with blocks l, l+1 swapped − intact, nats/token",
    "accuracy_delete": "top-1 accuracy on the true next token, block l deleted",
    "accuracy_swap": "top-1 accuracy on the true next token, blocks l, l+1 swapped",
    "agreement_delete": "share of tokens whose top-1 equals the intact model's, block l deleted",
    "agreement_swap": "share of tokens whose top-1 equals the intact model's, blocks l, l+1 swapped",
}
M = Names(*(metric(k, doc) for k, doc in _SCANS.items()))
A = Names(array("layers", "layer", "layer ids"), *(array(k, "layer", doc) for k, doc in _SCANS.items()))
S = Names(
    scalar("retained_min", "smallest retained accuracy over deletions and swaps"),
    scalar("retained_max", "largest retained accuracy over deletions and swaps"),
    scalar("retained_min_inner", "retained_min without the first and last layer"),
    scalar("retained_max_inner", "retained_max without the first and last layer"),
    scalar("retained_min_delete", "smallest retained accuracy over deletions"),
    scalar("retained_min_swap", "smallest retained accuracy over swaps"),
    scalar("base_accuracy", "top-1 accuracy of the intact model"),
    scalar("base_ce", "cross-entropy of the intact model, nats/token"),
    scalar("n_scored_tokens", "tokens with a known next token"),
    scalar("precision", "arithmetic of the variants' forward passes (lens.runtime.precision)"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A, layer_axis="block l deleted, or blocks l and l+1 swapped")
HEADLINES = (
        Headline("retained accuracy, min", h.summary(S.retained_min),
                 "72–95% retained when one layer is deleted or swapped (stages of inference)"),
        Headline("retained accuracy, max", h.summary(S.retained_max), "72–95% (stages of inference)"),
    )
CLAIMS = ()
