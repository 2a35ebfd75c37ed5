"""What the tuned lens study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.core.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.core.registry.declaration`)."""

from __future__ import annotations

from studies.reporting import headlines as h
from studies.core import stability
from studies.core.precision import CURVE_COMMAND, Precision
from studies.core.contract import Claim, Headline, Names, ResultSpec, Rule, array, interval_scalars, metric, scalar
from studies.logit_lens.declaration import DEPTH_PAPER, DEPTH_RULE, late_share_value, worse_than_uniform

M = Names(
    metric("ce", "tuned lens: cross-entropy to the true next token, held out, nats",
           title='cross-entropy, tuned lens', unit='nats/token'),
    metric("kl_to_final", "tuned lens: KL(p_final ‖ p_layer), held out, nats",
           title='KL to the final layer, tuned lens', unit='nats'),
    metric("top1_agreement", "tuned lens: top-1 agreement with the last layer",
           title='top-1 agreement, tuned lens', unit='share of tokens (0–1)'),
    metric("entropy", "tuned lens: entropy, nats", title='entropy, tuned lens', unit='nats'),
    metric("median_rank", "tuned lens: median rank of the true next token",
           title='median rank of the true token, tuned lens', unit='rank (0 = top-1)'),
    metric("logit_lens_ce", "logit lens on the same tokens: cross-entropy",
           title='cross-entropy, logit lens', unit='nats/token'),
    metric("logit_lens_kl", "logit lens on the same tokens: KL to the final layer",
           title='KL to the final layer, logit lens', unit='nats'),
    metric("logit_lens_top1_agreement", "logit lens on the same tokens: top-1 agreement",
           title='top-1 agreement, logit lens', unit='share of tokens (0–1)'),
    metric("train_kl", "tuned lens: training KL, mean over the last tenth of the steps",
           title='training KL (last tenth of steps)', unit='nats'),
    metric("jacobian_lens_ce", "Jacobian lens (Gurnee et al. 2026) on the same tokens: cross-entropy",
           title='cross-entropy, Jacobian lens', unit='nats/token'),
    metric("jacobian_lens_kl", "Jacobian lens on the same tokens: KL to the final layer",
           title='KL to the final layer, Jacobian lens', unit='nats'),
    metric("jacobian_lens_top1_agreement", "Jacobian lens on the same tokens: top-1 agreement with the model",
           title='top-1 agreement, Jacobian lens', unit='share of tokens (0–1)'),
    metric("jacobian_half_rel_diff", "Jacobian lens fitted on two halves of the prompts: ‖J_A − J_B‖_F / ‖J‖_F "
           "(0 at the last layer, J = I)", title='cross-half difference of J, Jacobian lens', unit='ratio'),
    metric("jacobian_half_top1_agreement", "Jacobian lens fitted on two halves of the prompts: share of held-out "
           "tokens whose top-1 the two half-lenses agree on (convergence of the fit)",
           title='cross-half top-1 agreement, Jacobian lens', unit='share of tokens (0–1)'),
)
S = Names(
    *stability.SCALARS,
    scalar("n_train_tokens", "tokens the translators were trained on", title='training tokens', unit='tokens'),
    scalar("n_test_tokens", "held-out tokens both lenses are scored on", title='held-out tokens', unit='tokens'),
    scalar("split_unit", "what the split holds out whole: doc or window", title='split unit'),
    scalar("mean_ce_gain", "mean over layers (but the last) of logit-lens CE − tuned-lens CE",
           title='mean CE gain over the logit lens', unit='nats/token'),
    scalar("mean_kl_tuned", "mean KL to the final layer, tuned lens",
           title='mean KL to the final layer, tuned lens', unit='nats'),
    scalar("mean_kl_logit", "mean KL to the final layer, logit lens",
           title='mean KL to the final layer, logit lens', unit='nats'),
    scalar("final_ce", "tuned-lens CE at the last layer (= the model's)",
           title='cross-entropy, last layer', unit='nats/token'),
    *interval_scalars("min_ce_gain", "the smallest over layers (but the last) of logit-lens CE − tuned-lens CE, held "
                      "out: > 0 when the tuned lens is better at every layer",
                      title="smallest CE gain over the logit lens (any layer)", unit="nats/token",
                      how="held-out units (interval_unit) resampled"),
    scalar("min_ce_gain_layer", "the layer with the smallest CE gain", title="layer of the smallest CE gain",
           unit="layer"),
    scalar("uniform_ce", "ln V: the cross-entropy of the uniform distribution over the model's V tokens",
           title="cross-entropy of the uniform distribution (ln V)", unit="nats/token"),
    scalar("n_layers_worse_than_uniform", "layers whose tuned-lens cross-entropy exceeds ln V",
           title="layers worse than uniform, tuned lens", unit="layers"),
    scalar("logit_lens_layers_worse_than_uniform", "layers whose logit-lens cross-entropy (held out) exceeds ln V",
           title="layers worse than uniform, logit lens", unit="layers"),
    *interval_scalars("late_drop_share", "share of the tuned-lens cross-entropy's fall made after mid depth (from "
                      "its highest value at or before mid depth to the last layer; held out)",
                      title="share of the CE drop after mid depth, tuned lens", unit="share of the drop (0–1)",
                      how="held-out units resampled"),
    scalar("interval_unit", "what the intervals resample (held-out documents when there are 10, else windows) and "
                            "what the nested refits subsample (training documents or windows)",
           title="interval and nested units"),
    scalar("lens_path", "folder of the saved lens, in the results folder", title='saved lens folder'),
    scalar("jacobian_note", "how the Jacobian lens was had: fitted here (on how many training windows, positions "
           "skipped), read from a file, or why not", title='Jacobian lens'),
    scalar("jacobian_n_prompts", "prompts (windows) the Jacobian lens averages over", title='Jacobian-lens prompts',
           unit='prompts'),
    scalar("mean_ce_gain_jacobian", "mean over layers (but the last) of logit-lens CE − Jacobian-lens CE",
           title='mean CE gain of the Jacobian lens over the logit lens', unit='nats/token'),
)
A = Names(
    array("layers", "layer", "layer ids"),
    array("loss_history", "step translator", "training KL per step and translated layer"),
    array("token_ce", "layer token", "tuned-lens cross-entropy per held-out token",
          title='cross-entropy, tuned lens', unit='nats'),
    array("logit_lens_token_ce", "layer token", "logit-lens cross-entropy per held-out token",
          title='cross-entropy, logit lens', unit='nats'),
    array("jacobian_lens_token_ce", "layer token", "Jacobian-lens cross-entropy per held-out token",
          title='cross-entropy, Jacobian lens', unit='nats'),
    array("test_rows", "token", "store rows of the held-out tokens"),
    array("train_rows", "train", "store rows of the training tokens"),
    array("translator_layers", "translator", "layers with a translator (all but the last)"),
)


def _ce_gain(rec):
    """Mean over layers of logit-lens CE − tuned-lens CE, from the per-layer metrics."""
    pairs = [(a, b) for a, b in zip(rec.metrics.get(M.ce, []), rec.metrics.get(M.logit_lens_ce, []))
             if a is not None and b is not None]
    return sum(b - a for a, b in pairs) / len(pairs) if pairs else None


def min_gain(tuned, logit) -> float | None:
    """The smallest over layers but the last (where both lenses are the model) of logit − tuned cross-entropy."""
    gains = [float(b) - float(a) for a, b in list(zip(tuned, logit))[:-1] if a is not None and b is not None]
    return min(gains) if gains else None


def _min_gain(rec):
    v = rec.summary.get(S.min_ce_gain)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    return min_gain(rec.metrics.get(M.ce, []), rec.metrics.get(M.logit_lens_ce, []))


RESULT = ResultSpec(metrics=M, summary=S, arrays=A, token_rows=A.test_rows)
HEADLINES = (Headline("mean CE gain over the logit lens (nats)", _ce_gain,
                      "> 0: translators beat the raw logit lens at early layers (tuned lens)"),
             Headline("smallest CE gain over the logit lens, any layer (nats)", _min_gain,
                      "> 0 at every layer (tuned lens, Belrose et al. 2023)"),
             Headline("mean CE gain of the Jacobian lens over the logit lens (nats)",
                      h.summary(S.mean_ce_gain_jacobian),
                      "> 0: J_l before the model's head decodes early layers better (Gurnee et al. 2026)"),
             Headline("share of the CE drop after mid depth, tuned lens", late_share_value(M.ce, S.late_drop_share),
                      "most of the drop after mid depth (stages of inference)"))
_NESTED = ("; nested N/4, N/2, N: the translators refitted on a quarter and a half of the training units (from "
           "their own least-squares starts, with steps in proportion to their training tokens: the same passes over "
           "their data), the three scored on the same nested_tokens held-out tokens")
CLAIMS = (
    Claim("smallest CE gain of the tuned lens over the logit lens, any layer", "the tuned lens predicts the next "
          "token better than the logit lens at every layer", "tuned lens (Belrose et al. 2023)", _min_gain,
          Rule("agrees > 0 (lower cross-entropy at every layer but the last); else contradicts", agrees=(1e-12, None)),
          low=h.summary(S.min_ce_gain_low), high=h.summary(S.min_ce_gain_high), unit="nats/token",
          paper="Belrose et al. 2023 (abstract): the tuned lens is 'more predictive, reliable and unbiased than the "
                "logit lens'; their evaluation (tuned_lens/scripts/eval_loop.py) is the cross-entropy to the true "
                "next token of each lens at every layer on held-out text, 'baseline_ce' (logit lens) beside "
                "'lens_ce' (tuned lens), reported in bits per byte, with the KL to the final layer beside it; the "
                "comparison is layer by layer, the tuned lens below the logit lens at each",
          method="held-out tokens (whole documents, else windows, never trained on): per layer the mean "
                 "cross-entropy (nats/token: the sign of a gain does not depend on nats vs bits per byte) of each "
                 "lens; value = the smallest over layers but the last of logit − tuned; 95% interval: held-out units "
                 "resampled 200 times, the per-layer means and their smallest gain recomputed" + _NESTED,
          instrument="translators trained for a few tens of Adam steps (steps=30 by default) from the least-squares "
                     "map, on thousands of tokens (Belrose et al. train thousands of steps from the identity)",
          key="min_ce_gain"),
    Claim("share of the CE drop made after mid depth (tuned lens)", "prediction sharpens in the second half of the "
          "model: most of the fall of the lens's cross-entropy comes after mid depth",
          "stages of inference (Lad et al. 2024); tuned lens (Belrose et al. 2023)",
          late_share_value(M.ce, S.late_drop_share), DEPTH_RULE,
          low=h.summary(S.late_drop_share_low), high=h.summary(S.late_drop_share_high),
          unit="share of the drop (0–1)", paper=DEPTH_PAPER,
          method="tuned-lens cross-entropy per layer on held-out tokens (nats/token); share = (CE[mid] − CE[last]) / "
                 "(max CE[layers ≤ mid] − CE[last]), clipped to 0–1; 95% interval: held-out units resampled 200 "
                 "times" + _NESTED,
          instrument="a tuned lens trained for a few tens of Adam steps (steps=30 by default) from the least-squares "
                     "map",
          applicable=worse_than_uniform(M.ce, S.uniform_ce, "the tuned lens does not read these layers either"),
          key="late_drop_share"),
)

# the precision the headline is reported to (issue #38, studies.core.precision): the default sample is the smallest
# size of the curve (sample, value, 95% low, high on smollm2-135m; docs/sample_sizes.md) of at least min_sample (10
# resampling units) whose interval reached it
PRECISION = Precision(
    "smallest CE gain of the tuned lens over the logit lens, any layer", "nats/token",
    h.summary(S.min_ce_gain),
    h.summary(S.min_ce_gain_low),
    h.summary(S.min_ce_gain_high),
    half_width=0.25, knob="sample_tokens", default=2048, scales=True, min_sample=1280,
    curve=((2048, 1.795, 1.597, 1.981),),
    command=CURVE_COMMAND,
    note="kept at 2048: sample_tokens is the held-out tokens both lenses are scored on (2 × 2048 tokens × 30 layers decoded, about a fifth of the study's time), while most of it is the translators' training (the full fit's 30 KL steps, and the nested refits' 0.75 of a fit since issue #38 sized their steps by their data), which it does not size; 2048 reaches ±0.19")
