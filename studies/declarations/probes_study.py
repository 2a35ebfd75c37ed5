"""What the probes study study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies import sample_size
from studies.contract import Claim, Headline, Names, ResultSpec, Rule, array, metric, scalar

M = Names(
    metric("accuracy", "cross-validated accuracy of the probe (real task)",
           title='probe accuracy (cross-validated)', unit='accuracy (0–1)'),
    metric("selectivity", "accuracy − control_accuracy",
           title='selectivity (accuracy − control)', unit='accuracy points'),
    metric("control_accuracy", "accuracy on the control task (random labels per token type)",
           title='control-task accuracy', unit='accuracy (0–1)'),
    metric("accuracy_std", "standard deviation of accuracy over folds",
           title='accuracy, std over folds', unit='accuracy points'),
    metric("mix_weight", "softmax weight of the layer in the scalar mix",
           title='scalar-mix weight', unit='weight (0–1)'),
)
S = Names(
    *sample_size.SCALARS,
    scalar("best_layer", "layer of the best accuracy", title='layer of the best accuracy', unit='layer'),
    scalar("best_accuracy", "best accuracy over layers", title='probe accuracy, best layer', unit='accuracy (0–1)'),
    scalar("best_selectivity_layer", "layer of the best selectivity",
           title='layer of the best selectivity', unit='layer'),
    scalar("best_selectivity", "best selectivity over layers",
           title='selectivity, best layer', unit='accuracy points'),
    scalar("majority", "accuracy of always answering the majority label",
           title='majority-label accuracy', unit='accuracy (0–1)'),
    scalar("positive_share", "share of probe tokens that contain the letter",
           title='share of tokens with the letter', unit='share of tokens (0–1)'),
    scalar("letter", "the character probed", title='letter probed'),
    scalar("kind", "probe kind: ridge or logistic", title='probe kind'),
    scalar("n_probe_tokens", "tokens sampled for the probes", title='probe tokens', unit='tokens'),
    scalar("split_unit", "what the folds keep together: doc or window", title='split unit'),
    scalar("n_folds", "cross-validation folds", title='folds', unit='folds'),
    scalar("control_strength", "the control task's regularisation: shared (the real task's) or per_task",
           title="control task's regularisation"),
    scalar("mix_accuracy", "held-out accuracy of the scalar-mix probe",
           title='scalar-mix probe accuracy', unit='accuracy (0–1)'),
    scalar("mix_gamma", "the scalar mix's scale", title='scalar-mix scale', unit='scale'),
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
CLAIMS = (
    Claim("best selectivity (accuracy − control task)", "a probe that reads the property, not memorises tokens, "
          "beats its control task", "Hewitt & Liang 2019", h.metric_max(M.selectivity),
          Rule("agrees > 0; else contradicts", agrees=(1e-12, None)), unit="accuracy points"),
)
