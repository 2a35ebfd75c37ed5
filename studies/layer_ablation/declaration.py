"""What the layer ablation study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.core.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.core.registry.declaration`)."""

from __future__ import annotations

from studies.reporting import headlines as h
from studies.core import stability
from studies.core.precision import CURVE_COMMAND, Precision
from studies.core.contract import (AxisKind, Claim, Headline, LayerAxis, Names, ResultSpec, Rule, array, interval_scalars,
                              metric, scalar)

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
    *interval_scalars("retained_mean_inner_delete", "mean over inner blocks l = 1..L-2 of the retained accuracy with "
                      "block l deleted (the paper's statistic)",
                      title="retained accuracy, mean over inner layers, block deleted", unit="share of intact accuracy",
                      how="resampling documents (windows when fewer than 10)"),
    *interval_scalars("retained_mean_inner_swap", "mean over inner pairs (l, l+1), l = 1..L-3, of the retained "
                      "accuracy with the two blocks swapped (the paper's statistic)",
                      title="retained accuracy, mean over inner layers, blocks swapped",
                      unit="share of intact accuracy",
                      how="resampling documents (windows when fewer than 10)"),
    scalar("units", "what the intervals resample: doc (documents) or window", title="resampled units"),
    scalar("n_units", "documents (or windows) the intervals resample", title="resampled units, count", unit="units"),
    *stability.SCALARS,
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A, layer_axis=LayerAxis(AxisKind.ABLATED, ""))
HEADLINES = (
        Headline("retained accuracy deleted, mean over inner layers", h.summary(S.retained_mean_inner_delete),
                 "72–95% of top-1 accuracy retained, per model, over the intervened layers (stages of inference)"),
        Headline("retained accuracy swapped, mean over inner layers", h.summary(S.retained_mean_inner_swap),
                 "72–95% of top-1 accuracy retained, per model, over the intervened layers (stages of inference)"),
        Headline("retained accuracy, min over inner layers (stricter, not judged)", h.summary(S.retained_min_inner),
                 "the paper reports an average; the worst single inner layer is a stricter number"),
    )

_SOURCE = "stages of inference (Lad, Gurnee & Tegmark 2024, arXiv:2406.19384)"
_PAPER = ("the retained top-1 next-token accuracy after an intervention, relative to the intact model, "
          "averaged over the intervened layers of a model: 'models retain 72–95% of their original top-1 "
          "prediction accuracy without any fine-tuning' (abstract; one number per model and intervention, over "
          "eight models), with the sensitive layers named apart: 'interventions to the early and final layers "
          "cause the most degradation, while the model is remarkably robust to dropping middle layers' "
          "(abstract, per-layer curves in the robustness figure). The first and last layers are left out of the "
          "average as the issue's reading of the paper has it; the paper's body was not readable from this "
          "session's sources to confirm the exact layer range")
_RULE = Rule("agrees ≥ 0.72 of the intact accuracy (the paper's lower end of 72–95%); weaker in [0.5, 0.72); "
             "else contradicts", agrees=(0.72, None), weaker=((0.5, 0.72),))


def _no_inner(key: str, what: str):
    def reason(rec):
        if rec.summary.get(key) is None:
            return f"no inner {what} to average (a model of too few blocks, or a result from before #37)"
        return None
    return reason


CLAIMS = (
    Claim("retained accuracy, block deleted, mean over inner layers",
          "deleting one layer (not the first or last) keeps 72–95% of the top-1 accuracy, on average over layers",
          _SOURCE, h.summary(S.retained_mean_inner_delete), _RULE,
          low=h.summary(S.retained_mean_inner_delete_low), high=h.summary(S.retained_mean_inner_delete_high),
          unit="share of intact accuracy", paper=_PAPER,
          method="top-1 accuracy on the true next token with block l deleted (its output := its input), over the "
                 "intact model's, averaged over blocks l = 1..L-2; 95% interval resampling documents (windows when "
                 "fewer than 10), the ratio Σ correct (mean over those layers) / Σ intact correct per resample",
          applicable=_no_inner(S.retained_mean_inner_delete, "block"), key=S.retained_mean_inner_delete),
    Claim("retained accuracy, blocks swapped, mean over inner layers",
          "swapping two adjacent layers (neither the first nor the last) keeps 72–95% of the top-1 accuracy, on "
          "average over layers", _SOURCE, h.summary(S.retained_mean_inner_swap), _RULE,
          low=h.summary(S.retained_mean_inner_swap_low), high=h.summary(S.retained_mean_inner_swap_high),
          unit="share of intact accuracy", paper=_PAPER,
          method="top-1 accuracy on the true next token with blocks l and l+1 run in swapped order, over the intact "
                 "model's, averaged over l = 1..L-3 (no swap touching the first or the last block); interval as "
                 "for deletion",
          applicable=_no_inner(S.retained_mean_inner_swap, "pair of blocks"), key=S.retained_mean_inner_swap),
)

# the precision the headline is reported to (issue #38, studies.core.precision): the default sample is the smallest
# size of the curve (sample, value, 95% low, high on smollm2-135m; docs/sample_sizes.md) of at least min_sample (10
# resampling units) whose interval reached it
PRECISION = Precision(
    "retained accuracy, block deleted, mean over inner layers", "share of intact accuracy",
    h.summary(S.retained_mean_inner_delete),
    h.summary(S.retained_mean_inner_delete_low),
    h.summary(S.retained_mean_inner_delete_high),
    half_width=0.05, knob="sample_tokens", default=1280, scales=True, min_sample=1280,
    curve=((256, 0.8883, 0.8587, 0.9126),
           (512, 0.8502, 0.8149, 0.889),
           (1280, 0.87, 0.8441, 0.9),
           (2048, 0.8779, 0.8563, 0.8968),),
    command=CURVE_COMMAND,
    note='re-checked on a 4000-token store of SmolLM2 (seed 0): ±0.019 at 1280 tokens')
