"""What the probes study study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import Headline, Names, ResultSpec, array, metric, scalar

M = Names(
    metric("accuracy", "cross-validated accuracy of the probe (real task)"),
    metric("selectivity", "accuracy − control_accuracy"),
    metric("control_accuracy", "accuracy on the control task (random labels per token type)"),
    metric("accuracy_std", "standard deviation of accuracy over folds"),
    metric("mix_weight", "softmax weight of the layer in the scalar mix"),
)
S = Names(
    scalar("best_layer", "layer of the best accuracy"),
    scalar("best_accuracy", "best accuracy over layers"),
    scalar("best_selectivity_layer", "layer of the best selectivity"),
    scalar("best_selectivity", "best selectivity over layers"),
    scalar("majority", "accuracy of always answering the majority label"),
    scalar("positive_share", "share of probe tokens that contain the letter"),
    scalar("letter", "the character probed"),
    scalar("kind", "probe kind: ridge or logistic"),
    scalar("n_probe_tokens", "tokens sampled for the probes"),
    scalar("split_unit", "what the folds keep together: doc or window"),
    scalar("n_folds", "cross-validation folds"),
    scalar("mix_accuracy", "held-out accuracy of the scalar-mix probe"),
    scalar("mix_gamma", "the scalar mix's scale"),
)
A = Names(
    array("layers", "layer", "layer ids"),
    array("rows", "token", "store rows of the probe tokens"),
    array("labels", "token", "1 where the token contains the letter"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A, token_rows=A.rows)
HEADLINES = (
        Headline("best probe accuracy", h.metric_max(M.accuracy), "high with positive selectivity"),
        Headline("best selectivity", h.metric_max(M.selectivity), "> 0 (Hewitt & Liang control task)"),
    )
CLAIMS = ()
