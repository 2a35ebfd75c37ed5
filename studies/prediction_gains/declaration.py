"""What the prediction gains study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.core.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.core.registry.declaration`)."""

from __future__ import annotations

import math

from studies.reporting import headlines as h
from studies.core import stability
from studies.core.precision import CURVE_COMMAND, Precision
from studies.core.contract import Claim, Headline, Names, ResultSpec, Rule, array, interval_scalars, metric, scalar

M = Names(
    metric("pr", "held-out prediction residual PR_l (ridge fit of the one-hot next token)",
           title='prediction residual PR (held out)', unit='PR (unexplained share, 0–1)'),
    metric("pr_low", "bootstrap interval of pr over test units, low",
           title='PR, 95% interval low', unit='PR (unexplained share, 0–1)'),
    metric("pr_high", "bootstrap interval of pr over test units, high",
           title='PR, 95% interval high', unit='PR (unexplained share, 0–1)'),
    metric("pr_in_sample", "PR fitted and scored on all tokens (the reference code's variant)",
           title='prediction residual PR (in-sample)', unit='PR (unexplained share, 0–1)'),
    metric("pr_token_id", "in-sample least-squares PR of the next token's id as a scalar target: the paper's recipe "
                          "(probes.token_id_pr)",
           title="prediction residual PR (paper's recipe: token id, in-sample)", unit='PR (unexplained share, 0–1)'),
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
    *stability.SCALARS,
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
    *interval_scalars("pearson_r_token_id", "Pearson r of log PR vs layer, PR the in-sample least squares of the "
                      "next token's id (the paper's recipe)",
                      title="Pearson r of log PR vs layer (paper's recipe: token id, in-sample)", unit="Pearson r",
                      how="low: delete-one-group jackknife over groups of whole documents (windows), Fisher z"),
    scalar("n_tokens_token_id", "tokens the in-sample token-id fit uses", title='tokens in the in-sample fit',
           unit='tokens'),
    scalar("n_groups_token_id", "jackknife groups (of whole documents or windows) behind that interval",
           title='jackknife groups', unit='groups'),
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
#: the paper's weakest model (He & Su 2024 report r from −0.983 to −0.997)
PAPER_WEAKEST = -0.983
#: below this |r| a straight line leaves more than ten times the paper's worst unexplained share of log PR's
#: variance over layers (1 − 0.983² = 3.4%, ×10 = 34%): not the paper's law, at most a falling trend
NO_LAW = -round(math.sqrt(1 - 10 * (1 - PAPER_WEAKEST ** 2)), 3)  # −0.814

LAW_RULE = Rule(f"agrees ≤ {PAPER_WEAKEST} (the paper's weakest model); weaker in ({PAPER_WEAKEST}, {NO_LAW}]: "
                f"a straight line in the layer still explains ≥ 66% of log PR's variance; contradicts > {NO_LAW}: "
                "the line leaves over ten times the paper's worst unexplained share (1 − 0.983² = 3.4%) — no law",
                agrees=(None, PAPER_WEAKEST), weaker=((PAPER_WEAKEST, NO_LAW),))

HEADLINES = (
        Headline("Pearson r of log PR vs layer (paper's recipe: in-sample token-id least squares)",
                 h.summary(S.pearson_r_token_id), "−0.983 … −0.997 across model families (He & Su 2024)"),
        Headline("Pearson r of log PR vs layer (ours: held-out one-hot ridge)", h.summary(S.pearson_r),
                 "ours, a stricter instrument than the paper's: not judged against its range"),
        Headline("PR decay ratio per layer (held out)", h.summary(S.decay_ratio),
                 "each layer contributes an equal log-gain"),
    )
CLAIMS = (
    Claim("Pearson r of log PR vs layer (paper's recipe)", "each layer contributes equally: log PR falls linearly "
          "with depth, r from −0.983 to −0.997", "A Law of Next-Token Prediction in LLMs (He & Su 2024)",
          h.summary(S.pearson_r_token_id), LAW_RULE,
          low=h.summary(S.pearson_r_token_id_low), high=h.summary(S.pearson_r_token_id_high),
          unit="Pearson r",
          paper="Pearson r of log PR_l against the layer index l, −0.983 … −0.997 over the paper's models (He & "
                "Su 2024, the equi-learning law); PR_l = the residual sum of squares of a least-squares fit of the "
                "next token from layer l's states (through a newly initialised final norm) over the total sum of "
                "squares, fitted and scored on the same tokens, with the next token's id as the scalar target "
                "(the paper's reference code, issue #37)",
          method="in-sample least squares (affine) of the next token's id on the output of every block (resid_post, "
                 "blocks 1..L; the embeddings are not a layer of the law), each through a fresh final norm of the "
                 "model's kind; PR_l = RSS/TSS; Pearson r of log PR_l vs l. 95% interval: delete-one-group "
                 "jackknife over at most 20 random groups of whole documents (windows when there are fewer than "
                 "10), on Fisher z. Nested: the same fit on a quarter and a half of the documents — an in-sample "
                 "fit drifts with the tokens per dimension, and these values show by how much",
          key=S.pearson_r_token_id),
)

# the precision the headline is reported to (issue #38, studies.core.precision): the default sample is the smallest
# size of the curve (sample, value, 95% low, high on smollm2-135m; docs/sample_sizes.md) of at least min_sample (10
# resampling units) whose interval reached it
PRECISION = Precision(
    "Pearson r of log PR vs layer (paper's recipe)", "Pearson r",
    h.summary(S.pearson_r_token_id),
    h.summary(S.pearson_r_token_id_low),
    h.summary(S.pearson_r_token_id_high),
    half_width=0.03, knob="max_tokens", default=20000, scales=False, min_sample=1280,
    curve=((20000, -0.962, -0.9786, -0.9329),),
    command=CURVE_COMMAND,
    note='an in-sample fit over every token of the store: its sample is the store (--max-tokens); the curve is the nested N/4, N/2, N values')
