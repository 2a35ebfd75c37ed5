"""What the probes study study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.core.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.core.registry.declaration`)."""

from __future__ import annotations

from studies.reporting import headlines as h
from studies.core import stability
from studies.core.precision import CURVE_COMMAND, Precision
from studies.core.contract import Claim, Headline, Names, ResultSpec, Rule, array, interval_scalars, metric, scalar

M = Names(
    metric("accuracy", "cross-validated accuracy of the probe (real task)",
           title='probe accuracy (cross-validated)', unit='accuracy (0–1)'),
    metric("selectivity", "accuracy − control_accuracy",
           title='selectivity (accuracy − control)', unit='accuracy points'),
    metric("control_accuracy", "accuracy on the control task (random labels per token type), mean over draws",
           title='control-task accuracy', unit='accuracy (0–1)'),
    metric("accuracy_std", "standard deviation of accuracy over folds",
           title='accuracy, std over folds', unit='accuracy points'),
    metric("mix_weight", "softmax weight of the layer in the scalar mix",
           title='scalar-mix weight', unit='weight (0–1)'),
    metric("selectivity_low", "2.5% of the out-of-fold selectivity's unit bootstrap, widened by the control "
           "draws' spread", title='selectivity, 95% interval low', unit='accuracy points'),
    metric("selectivity_high", "97.5% of the out-of-fold selectivity's unit bootstrap, widened by the control "
           "draws' spread", title='selectivity, 95% interval high', unit='accuracy points'),
)
S = Names(
    *stability.SCALARS,
    *interval_scalars("mean_selectivity", "selectivity averaged over layers, out of fold (the judged claim)",
                      title="selectivity, mean over layers", unit="accuracy points",
                      how="2.5% of its unit bootstrap, widened by the control draws' spread"),
    scalar("control_draw_selectivity", "mean selectivity against each control draw alone (seed, seed + 1, ...)",
           title='mean selectivity per control draw', unit='accuracy points'),
    scalar("n_units", "split units (documents or windows) among the probe tokens", title='split units',
           unit='units'),
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
        Headline("selectivity, mean over layers", h.summary(S.mean_selectivity),
                 "> 0: a linear probe is selective (Hewitt & Liang 2019)"),
        Headline("best probe accuracy", h.metric_max(M.accuracy), "high with positive selectivity"),
        Headline("best selectivity", h.metric_max(M.selectivity), "in-sample best of the layers (not judged)"),
    )


def _applicable(rec) -> str | None:
    if rec.summary.get(S.mean_selectivity) is None:
        return ("the result predates the out-of-fold mean selectivity (mean_selectivity); rerun the study to "
                "judge it on the paper's statistic")
    return None


PAPER = ("Selectivity = linguistic-task accuracy − control-task accuracy of the same probe on the same "
         "representation, the control task giving each word type a random output drawn from the task's label "
         "distribution, both scored on held-out data (Hewitt & Liang 2019, §2–3): \"a good probe ... should be "
         "selective, achieving high linguistic task accuracy and low control task accuracy\". They find linear "
         "and bilinear probes on ELMo selective and MLP probes with default settings not (abstract: \"popular "
         "probes on ELMo representations are not selective\"), and report selectivity per layer (ELMo 0, 1, 2): "
         "\"while probes on the first layer of ELMo yield slightly better part-of-speech tagging accuracy than "
         "the second, probes on the second layer are substantially more selective\". The claim judged here is "
         "theirs for linear probes: selectivity > 0 on the model's states, no layer picked for it.")
METHOD = ("A linear probe (ridge classifier by default, strength by exact leave-one-out on the training folds) "
          "for 'the token's text contains the letter' at every layer, and for Hewitt & Liang's control task "
          "(one random label per token id, drawn from the empirical label distribution) with the strength the "
          "real task chose in the same fold (their one probe configuration for both); the control task is drawn "
          "5 times and its accuracy averaged, since one draw's labels for the few most frequent token types "
          "move the control accuracy by several points. Folds keep documents (or "
          "windows) whole. The judged value is the selectivity averaged over all layers from the out-of-fold "
          "predictions (no layer picked on the data: best_selectivity, the maximum over layers, is not judged). "
          "95% interval: 1000 bootstrap resamples of whole documents/windows (the unit the folds keep "
          "together), each side widened in quadrature by 1.96 standard errors of the mean over the draws; nested: the probes refitted on a quarter and a half of the units.")
INSTRUMENT = ("a spelling property of the token (contains the letter) on a decoder's residual stream, not "
              "part-of-speech or dependency edges on ELMo; a binary task, so its selectivity is not on the "
              "scale of their 45-tag part-of-speech task and only its sign is judged")
CLAIMS = (
    Claim("selectivity (accuracy − control task), mean over layers, out of fold",
          "a linear probe reads the property, not memorised token identities: it beats its control task",
          "Hewitt & Liang 2019", h.summary(S.mean_selectivity),
          Rule("agrees: mean selectivity > 0 (the whole interval above 0); contradicts: ≤ 0", agrees=(1e-12, None)),
          low=h.summary(S.mean_selectivity_low), high=h.summary(S.mean_selectivity_high), unit="accuracy points",
          paper=PAPER, method=METHOD, instrument=INSTRUMENT, applicable=_applicable, key=S.mean_selectivity),
)

# the precision the headline is reported to (issue #38, studies.core.precision): the default sample is the smallest
# size of the curve (sample, value, 95% low, high on smollm2-135m; docs/sample_sizes.md) of at least min_sample (10
# resampling units) whose interval reached it
PRECISION = Precision(
    "selectivity, mean over layers, out of fold", "accuracy points",
    h.summary(S.mean_selectivity),
    h.summary(S.mean_selectivity_low),
    h.summary(S.mean_selectivity_high),
    half_width=0.03, knob="sample_tokens", default=4000, scales=True, min_sample=1280, missed=(1280, 2000),
    curve=((500, 0.06911, 0.04466, 0.09493),
           (1280, 0.05661, 0.04129, 0.072),
           (2000, 0.0682, 0.0444, 0.09102),
           (4000, 0.06612, 0.05098, 0.08047),),
    command=CURVE_COMMAND,
    note="re-checked on a 4000-token store of SmolLM2 (seed 0), 1280 and 2000 tokens gave ±0.035 and ±0.034 where the main job's store gave ±0.015 and ±0.023: at ten to twenty windows the interval's width varies by two between draws, so the default stays 4000 (±0.025 there, ±0.015 on the main job's store)")
