"""What the tuned lens study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import sample_size
from studies.contract import Claim, Headline, Names, ResultSpec, Rule, array, metric, scalar

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
)
S = Names(
    *sample_size.SCALARS,
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
    scalar("lens_path", "folder of the saved lens, in the results folder", title='saved lens folder'),
)
A = Names(
    array("layers", "layer", "layer ids"),
    array("loss_history", "step translator", "training KL per step and translated layer"),
    array("token_ce", "layer token", "tuned-lens cross-entropy per held-out token",
          title='cross-entropy, tuned lens', unit='nats'),
    array("logit_lens_token_ce", "layer token", "logit-lens cross-entropy per held-out token",
          title='cross-entropy, logit lens', unit='nats'),
    array("test_rows", "token", "store rows of the held-out tokens"),
    array("train_rows", "train", "store rows of the training tokens"),
    array("translator_layers", "translator", "layers with a translator (all but the last)"),
)


def _ce_gain(rec):
    """Mean over layers of logit-lens CE − tuned-lens CE, from the per-layer metrics."""
    pairs = [(a, b) for a, b in zip(rec.metrics.get(M.ce, []), rec.metrics.get(M.logit_lens_ce, []))
             if a is not None and b is not None]
    return sum(b - a for a, b in pairs) / len(pairs) if pairs else None


RESULT = ResultSpec(metrics=M, summary=S, arrays=A, token_rows=A.test_rows)
HEADLINES = (Headline("mean CE gain over the logit lens (nats)", _ce_gain,
                        "> 0: translators beat the raw logit lens at early layers (tuned lens)"),)
CLAIMS = (
    Claim("mean CE gain of the tuned lens over the logit lens", "affine translators decode earlier layers better "
          "than the raw logit lens", "tuned lens (Belrose et al. 2023)", _ce_gain,
          Rule("agrees > 0; else contradicts", agrees=(1e-12, None)), unit="nats/token"),
)
