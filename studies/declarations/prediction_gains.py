"""What the prediction gains study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import Headline, Names, ResultSpec, array, metric, scalar

M = Names(
    metric("pr", "held-out prediction residual PR_l (ridge fit of the one-hot next token)"),
    metric("pr_low", "bootstrap interval of pr over test units, low"),
    metric("pr_high", "bootstrap interval of pr over test units, high"),
    metric("pr_in_sample", "PR fitted and scored on all tokens (the reference code's variant)"),
    metric("pr_token_id", "in-sample PR of the scalar token-id target (the reference code's variant)"),
    metric("gain_share", "share of the total log-PR gain made at this layer"),
    metric("alpha_relative", "the ridge strength chosen on validation (relative grid value)"),
    metric("logit_lens_ce", "logit-lens cross-entropy to the true next token, nats"),
    metric("logit_lens_ce_drop", "logit-lens CE drop from the layer before (None at the first layer)"),
)
S = Names(
    scalar("pearson_r", "Pearson r of log10 PR against layer, held out"),
    scalar("decay_ratio", "decay ratio ρ of PR per layer, held out"),
    scalar("slope_log10", "slope of log10 PR on layer, held out"),
    scalar("intercept_log10", "intercept of that fit"),
    scalar("pearson_r_low", "bootstrap interval of pearson_r, low"),
    scalar("pearson_r_high", "bootstrap interval of pearson_r, high"),
    scalar("slope_log10_low", "bootstrap interval of slope_log10, low"),
    scalar("slope_log10_high", "bootstrap interval of slope_log10, high"),
    scalar("pearson_r_in_sample", "pearson_r of the in-sample PR"),
    scalar("decay_ratio_in_sample", "decay_ratio of the in-sample PR"),
    scalar("slope_log10_in_sample", "slope_log10 of the in-sample PR"),
    scalar("pearson_r_token_id", "pearson_r of the token-id PR"),
    scalar("decay_ratio_token_id", "decay_ratio of the token-id PR"),
    scalar("slope_log10_token_id", "slope_log10 of the token-id PR"),
    scalar("n_train_tokens", "tokens the ridge maps were fitted on"),
    scalar("n_val_tokens", "tokens the ridge strength was chosen on"),
    scalar("n_test_tokens", "held-out tokens PR is scored on"),
    scalar("split_unit", "what the split keeps together: doc or window"),
    scalar("norm", "the fresh norm before the fit: rms, layer or None"),
    scalar("norm_source", "why that norm: the model card's final norm, a fallback, or the config"),
    scalar("logit_lens", "how the logit-lens column was computed (or why not)"),
    scalar("logit_lens_ce_last", "logit-lens cross-entropy at the last layer, nats"),
)
A = Names(
    array("layers", "layer", "layer ids"),
    array("pr", "layer", "held-out PR"),
    array("pr_low", "layer", "bootstrap interval, low"),
    array("pr_high", "layer", "bootstrap interval, high"),
    array("pr_in_sample", "layer", "in-sample PR"),
    array("pr_token_id", "layer", "token-id PR"),
    array("val_pr", "layer alpha", "validation PR over the ridge grid"),
    array("alphas_relative", "alpha", "the ridge grid (relative to the mean variance)"),
    array("alpha", "layer", "absolute ridge strength used per layer"),
    array("boot_pr", "boot layer", "bootstrap replicates of held-out PR"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A)
HEADLINES = (
        Headline("Pearson r of log PR vs layer (held-out)", h.summary(S.pearson_r),
                 "−0.983 … −0.997 across model families (He & Su 2024)"),
        Headline("Pearson r, in-sample fit", h.summary(S.pearson_r_in_sample), "−0.983 … −0.997 (He & Su 2024)"),
        Headline("PR decay ratio (first / last layer)", h.summary(S.decay_ratio),
                 "each layer contributes an equal log-gain"),
    )
CLAIMS = ()
