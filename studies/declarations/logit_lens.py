"""What the logit lens study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import Headline, Names, ResultSpec, array, metric, scalar

M = Names(
    metric("ce", "cross-entropy to the true next token, nats per token"),
    metric("ce_low", "bootstrap interval of ce (whole documents or windows resampled), low"),
    metric("ce_high", "bootstrap interval of ce, high"),
    metric("kl_to_final", "KL(p_final ‖ p_layer), nats"),
    metric("top1_agreement", "share of tokens whose top-1 equals the last layer's"),
    metric("top1_accuracy", "share of tokens whose top-1 is the true next token"),
    metric("entropy", "entropy of the lens distribution, nats"),
    metric("median_rank", "median rank of the true next token (0 = top-1)"),
    metric("mean_rank", "mean rank of the true next token"),
    metric("mid_ce", "ce of resid_mid (after attention, before the MLP)"),
    metric("mid_kl_to_final", "kl_to_final of resid_mid"),
    metric("mid_top1_agreement", "top1_agreement of resid_mid"),
    metric("mid_entropy", "entropy of resid_mid"),
    metric("mid_median_rank", "median_rank of resid_mid"),
)
S = Names(
    scalar("last_layer_max_abs_logit_diff", "max |lens of the last layer − the model's logits| (0 expected)"),
    scalar("bootstrap_unit", "what the CE interval resamples: doc or window"),
    scalar("final_ce", "ce at the last layer"),
    scalar("first_layer_ce", "ce at the first layer"),
    scalar("n_scored_tokens", "tokens with a known next token inside the mask"),
    scalar("layer_kl_below_1", "first layer whose KL to the final layer is below 1 nat"),
    scalar("layer_top1_agreement_above_half", "first layer whose top-1 agrees with the last on half the tokens"),
    scalar("resid_mid", "whether resid_mid was decoded, or why not"),
    scalar("decode_precision", "what the lens decoded in (float32; a bfloat16 / float16 model's final norm and "
                               "unembedding upcast)"),
)
_TOKEN = "the decoded tokens' column of the store's token table"
A = Names(
    array("layers", "layer", "layer ids"),
    array("token_ce", "layer token", "cross-entropy per token, NaN where the next token is unknown"),
    array("token_rank", "layer token", "rank of the true next token, -1 where unknown"),
    array("token_top1", "layer token", "the lens' top-1 token id", label=True),
    array("token_top1_str", "layer token", "the lens' top-1 token text", label=True),
    array("token_kl", "layer token", "KL to the final layer per token"),
    array("topk_rows", "row", "store rows of the first topk_tokens decoded tokens"),
    array("topk_ids", "layer row k", "top-k token ids"),
    array("topk_probs", "layer row k", "top-k probabilities"),
    array("topk_str", "layer row k", "top-k token texts"),
    array("ce_by_position", "layer position", "mean CE per position in the window"),
    array("position_count", "position", "scored tokens per position"),
    array("token_index", "token", "store row of each decoded token"),
    *(array(c, "token", _TOKEN, label=True)
      for c in ("token", "token_id", "next_token_id", "doc", "window", "pos", "special")),
    array("mid_token_ce", "layer token", "token_ce of resid_mid"),
    array("mid_token_rank", "layer token", "token_rank of resid_mid"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A, token_rows=A.token_index, token_text=A.token)
HEADLINES = (
        Headline("max |logit diff| last layer vs model", h.summary(S.last_layer_max_abs_logit_diff),
                 "0 (the last layer's lens is the model's own output)"),
        Headline("cross-entropy, last layer", h.metric_last(M.ce),
                 "falls sharply after mid depth (stages of inference)"),
    )
CLAIMS = ()
