"""What the prediction gains study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies import sample_size
from studies.contract import Claim, Headline, Names, ResultSpec, Rule, array, metric, scalar

M = Names(
    metric("pr", "held-out prediction residual PR_l (ridge fit of the one-hot next token)",
           title='prediction residual PR (held out)', unit='PR (unexplained share, 0–1)'),
    metric("pr_low", "bootstrap interval of pr over test units, low",
           title='PR, 95% interval low', unit='PR (unexplained share, 0–1)'),
    metric("pr_high", "bootstrap interval of pr over test units, high",
           title='PR, 95% interval high', unit='PR (unexplained share, 0–1)'),
    metric("pr_in_sample", "PR fitted and scored on all tokens (the reference code's variant)",
           title='prediction residual PR (in-sample)', unit='PR (unexplained share, 0–1)'),
    metric("pr_token_id", "in-sample PR of the scalar token-id target (the reference code's variant)",
           title='prediction residual PR (token-id target, in-sample)', unit='PR (unexplained share, 0–1)'),
    metric("gain_share", "share of the total log-PR gain made at this layer",
           title='share of the log-PR gain at this layer', unit='share of the total gain (0–1)'),
    metric("alpha_relative", "the ridge strength chosen on validation (relative grid value)",
           title='ridge strength chosen', unit='relative to the mean variance'),
    metric("logit_lens_ce", "logit-lens cross-entropy to the true next token, nats",
           title='logit-lens cross-entropy', unit='nats/token'),
    metric("logit_lens_ce_drop", "logit-lens CE drop from the layer before (None at the first layer)",
           title='logit-lens CE drop from the layer before', unit='nats/token'),
)
S = Names(
    *sample_size.SCALARS,
    scalar("pearson_r", "Pearson r of log10 PR against layer, held out",
           title='Pearson r of log PR vs layer (held out)', unit='Pearson r'),
    scalar("decay_ratio", "decay ratio ρ of PR per layer, held out",
           title='PR decay ratio per layer (held out)', unit='ratio'),
    scalar("slope_log10", "slope of log10 PR on layer, held out",
           title='slope of log10 PR per layer (held out)', unit='log10 PR per layer'),
    scalar("intercept_log10", "intercept of that fit", title='intercept of log10 PR', unit='log10 PR'),
    scalar("pearson_r_low", "bootstrap interval of pearson_r, low",
           title='Pearson r, 95% interval low', unit='Pearson r'),
    scalar("pearson_r_high", "bootstrap interval of pearson_r, high",
           title='Pearson r, 95% interval high', unit='Pearson r'),
    scalar("slope_log10_low", "bootstrap interval of slope_log10, low",
           title='slope, 95% interval low', unit='log10 PR per layer'),
    scalar("slope_log10_high", "bootstrap interval of slope_log10, high",
           title='slope, 95% interval high', unit='log10 PR per layer'),
    scalar("pearson_r_in_sample", "pearson_r of the in-sample PR", title='Pearson r (in-sample)', unit='Pearson r'),
    scalar("decay_ratio_in_sample", "decay_ratio of the in-sample PR",
           title='PR decay ratio (in-sample)', unit='ratio'),
    scalar("slope_log10_in_sample", "slope_log10 of the in-sample PR",
           title='slope of log10 PR (in-sample)', unit='log10 PR per layer'),
    scalar("pearson_r_token_id", "pearson_r of the token-id PR",
           title='Pearson r (token-id target)', unit='Pearson r'),
    scalar("decay_ratio_token_id", "decay_ratio of the token-id PR",
           title='PR decay ratio (token-id target)', unit='ratio'),
    scalar("slope_log10_token_id", "slope_log10 of the token-id PR",
           title='slope of log10 PR (token-id target)', unit='log10 PR per layer'),
    scalar("n_train_tokens", "tokens the ridge maps were fitted on", title='training tokens', unit='tokens'),
    scalar("n_val_tokens", "tokens the ridge strength was chosen on", title='validation tokens', unit='tokens'),
    scalar("n_test_tokens", "held-out tokens PR is scored on", title='held-out tokens', unit='tokens'),
    scalar("split_unit", "what the split keeps together: doc or window", title='split unit'),
    scalar("norm", "the fresh norm before the fit: rms, layer or None", title='fresh norm'),
    scalar("norm_source", "why that norm: the model card's final norm, a fallback, or the config",
           title='why that norm'),
    scalar("logit_lens", "how the logit-lens column was computed (or why not)", title='logit-lens column'),
    scalar("logit_lens_ce_last", "logit-lens cross-entropy at the last layer, nats",
           title='logit-lens cross-entropy, last layer', unit='nats/token'),
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
CLAIMS = (
    Claim("Pearson r of log PR vs layer (held out)", "each layer contributes equally: log PR falls linearly with "
          "depth, r from −0.983 to −0.997", "A Law of Next-Token Prediction in LLMs (He & Su 2024)",
          h.summary(S.pearson_r), Rule("agrees ≤ −0.983 (the paper's weakest); weaker in (−0.983, 0); ≥ 0 contradicts",
                                       agrees=(None, -0.983), weaker=((-0.983, -1e-12),)),
          low=h.summary(S.pearson_r_low), high=h.summary(S.pearson_r_high), unit="Pearson r"),
)
