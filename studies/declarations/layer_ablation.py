"""What the layer ablation study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import AxisKind, Claim, Headline, LayerAxis, Names, ResultSpec, Rule, array, metric, scalar

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
_LABELS = {  # name -> (title, unit)
    "retained_accuracy_delete": ("retained accuracy, block deleted", "share of intact accuracy"),
    "retained_accuracy_swap": ("retained accuracy, blocks swapped", "share of intact accuracy"),
    "delta_ce_delete": ("Δ cross-entropy, block deleted", "nats/token"),
    "delta_ce_swap": ("Δ cross-entropy, blocks swapped", "nats/token"),
    "accuracy_delete": ("top-1 accuracy, block deleted", "accuracy (0–1)"),
    "accuracy_swap": ("top-1 accuracy, blocks swapped", "accuracy (0–1)"),
    "agreement_delete": ("top-1 agreement with the intact model, block deleted", "share of tokens (0–1)"),
    "agreement_swap": ("top-1 agreement with the intact model, blocks swapped", "share of tokens (0–1)"),
}
M = Names(*(metric(k, doc, title=_LABELS[k][0], unit=_LABELS[k][1]) for k, doc in _SCANS.items()))
A = Names(array("layers", "layer", "layer ids"),
          *(array(k, "layer", doc, title=_LABELS[k][0], unit=_LABELS[k][1]) for k, doc in _SCANS.items()))
S = Names(
    scalar("retained_min", "smallest retained accuracy over deletions and swaps",
           title='retained accuracy, min', unit='share of intact accuracy'),
    scalar("retained_max", "largest retained accuracy over deletions and swaps",
           title='retained accuracy, max', unit='share of intact accuracy'),
    scalar("retained_min_inner", "retained_min without the first and last layer",
           title='retained accuracy, min (inner layers)', unit='share of intact accuracy'),
    scalar("retained_max_inner", "retained_max without the first and last layer",
           title='retained accuracy, max (inner layers)', unit='share of intact accuracy'),
    scalar("retained_min_delete", "smallest retained accuracy over deletions",
           title='retained accuracy, min over deletions', unit='share of intact accuracy'),
    scalar("retained_min_swap", "smallest retained accuracy over swaps",
           title='retained accuracy, min over swaps', unit='share of intact accuracy'),
    scalar("base_accuracy", "top-1 accuracy of the intact model",
           title='top-1 accuracy, intact model', unit='accuracy (0–1)'),
    scalar("base_ce", "cross-entropy of the intact model, nats/token",
           title='cross-entropy, intact model', unit='nats/token'),
    scalar("n_scored_tokens", "tokens with a known next token", title='scored tokens', unit='tokens'),
    scalar("precision", "arithmetic of the variants' forward passes (lens.runtime.precision)", title='arithmetic'),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A, layer_axis=LayerAxis(AxisKind.ABLATED, ""))
HEADLINES = (
        Headline("retained accuracy, min", h.summary(S.retained_min),
                 "72–95% retained when one layer is deleted or swapped (stages of inference)"),
        Headline("retained accuracy, max", h.summary(S.retained_max), "72–95% (stages of inference)"),
    )
CLAIMS = (
    Claim("retained accuracy, min over inner layers", "deleting or swapping any one layer but the first and last "
          "keeps 72–95% of accuracy", "stages of inference (Lad et al. 2024)", h.summary(S.retained_min_inner),
          Rule("agrees ≥ 0.72 of the intact accuracy (the paper's lower end); weaker in [0.5, 0.72); else contradicts",
               agrees=(0.72, None), weaker=((0.5, 0.72),)), unit="share of intact accuracy"),
)
