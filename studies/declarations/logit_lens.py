"""What the logit lens study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import AxisKind, Claim, Headline, LayerAxis, Names, ResultSpec, Rule, array, metric, scalar

M = Names(
    metric("ce", "cross-entropy to the true next token, nats per token", title="cross-entropy", unit="nats/token"),
    metric("ce_low", "bootstrap interval of ce (whole documents or windows resampled), low",
           title="cross-entropy, 95% interval low", unit="nats/token"),
    metric("ce_high", "bootstrap interval of ce, high", title="cross-entropy, 95% interval high", unit="nats/token"),
    metric("kl_to_final", "KL(p_final ‖ p_layer), nats", title="KL to the final layer", unit="nats"),
    metric("top1_agreement", "share of tokens whose top-1 equals the last layer's",
           title="top-1 agreement with the last layer", unit="share of tokens (0–1)"),
    metric("top1_accuracy", "share of tokens whose top-1 is the true next token",
           title="top-1 accuracy", unit="share of tokens (0–1)"),
    metric("entropy", "entropy of the lens distribution, nats", title="entropy of the lens", unit="nats"),
    metric("median_rank", "median rank of the true next token (0 = top-1)",
           title="median rank of the true token", unit="rank (0 = top-1)"),
    metric("mean_rank", "mean rank of the true next token",
           title="mean rank of the true token", unit="rank (0 = top-1)"),
    metric("mid_ce", "ce of resid_mid (after attention, before the MLP)",
           title="cross-entropy, resid_mid", unit="nats/token"),
    metric("mid_kl_to_final", "kl_to_final of resid_mid", title="KL to the final layer, resid_mid", unit="nats"),
    metric("mid_top1_agreement", "top1_agreement of resid_mid",
           title="top-1 agreement, resid_mid", unit="share of tokens (0–1)"),
    metric("mid_entropy", "entropy of resid_mid", title="entropy of the lens, resid_mid", unit="nats"),
    metric("mid_median_rank", "median_rank of resid_mid",
           title="median rank of the true token, resid_mid", unit="rank (0 = top-1)"),
)
S = Names(
    scalar("last_layer_max_abs_logit_diff", "max |lens of the last layer − the model's logits| (0 expected)",
           title="max |logit diff|, last layer vs model", unit="logits"),
    scalar("bootstrap_unit", "what the CE interval resamples: doc or window", title="bootstrap unit"),
    scalar("final_ce", "ce at the last layer", title="cross-entropy, last layer", unit="nats/token"),
    scalar("first_layer_ce", "ce at the first layer", title="cross-entropy, first layer", unit="nats/token"),
    scalar("n_scored_tokens", "tokens with a known next token inside the mask", title="scored tokens", unit="tokens"),
    scalar("layer_kl_below_1", "first layer whose KL to the final layer is below 1 nat",
           title="first layer with KL < 1 nat",
           unit="layer"),
    scalar("layer_top1_agreement_above_half", "first layer whose top-1 agrees with the last on half the tokens",
           title="first layer with top-1 agreement > ½", unit="layer"),
    scalar("resid_mid", "whether resid_mid was decoded, or why not", title="resid_mid decoded"),
    scalar("decode_precision", "what the lens decoded in (float32; a bfloat16 / float16 model's final norm and "
                               "unembedding upcast)", title="decode precision"),
)
_TOKEN = "the decoded tokens' column of the store's token table"
A = Names(
    array("layers", "layer", "layer ids"),
    array("token_ce", "layer token", "cross-entropy per token, NaN where the next token is unknown",
          title="cross-entropy", unit="nats"),
    array("token_rank", "layer token", "rank of the true next token, -1 where unknown",
          title="rank of the true token",
          unit="rank (0 = top-1)"),
    array("token_top1", "layer token", "the lens' top-1 token id", label=True),
    array("token_top1_str", "layer token", "the lens' top-1 token text", label=True),
    array("token_kl", "layer token", "KL to the final layer per token", title="KL to the final layer", unit="nats"),
    array("topk_rows", "row", "store rows of the first topk_tokens decoded tokens"),
    array("topk_ids", "layer row k", "top-k token ids"),
    array("topk_probs", "layer row k", "top-k probabilities"),
    array("topk_str", "layer row k", "top-k token texts"),
    array("ce_by_position", "layer position", "mean CE per position in the window"),
    array("position_count", "position", "scored tokens per position"),
    array("token_index", "token", "store row of each decoded token"),
    *(array(c, "token", _TOKEN, label=True)
      for c in ("token", "token_id", "next_token_id", "doc", "window", "pos", "special")),
    array("mid_token_ce", "layer token", "token_ce of resid_mid", title="cross-entropy, resid_mid", unit="nats"),
    # the explorer's token × layer grid (studies.logit_lens): axis ``grid`` = the first config.grid_tokens
    # entries of the ``token`` axis (all of them by default); grid_topk indexes grid_vocab, the texts of
    # the distinct token ids that appear in grid_topk / mid_grid_topk
    array("token_entropy", "layer token", "entropy of the lens distribution per token", title="entropy of the lens",
          unit="nats"),
    array("grid_vocab", "vocab", "texts of the token ids in grid_topk / mid_grid_topk", label=True),
    array("grid_topk", "layer grid k", "top-k tokens per decoded token and layer, as indices into grid_vocab",
          label=True),
    array("grid_topk_probs", "layer grid k", "their probabilities (float16)",
          title="probability", unit="probability"),
    array("mid_token_kl", "layer token", "token_kl of resid_mid",
          title="KL to the final layer, resid_mid", unit="nats"),
    array("mid_token_entropy", "layer token", "token_entropy of resid_mid", title="entropy of the lens, resid_mid",
          unit="nats"),
    array("mid_grid_topk", "layer grid k", "grid_topk of resid_mid", label=True),
    array("mid_grid_topk_probs", "layer grid k", "grid_topk_probs of resid_mid", title="probability",
          unit="probability"),
    array("mid_token_rank", "layer token", "token_rank of resid_mid", title="rank of the true token, resid_mid",
          unit="rank (0 = top-1)"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A, token_rows=A.token_index, token_text=A.token,
                    layer_axis=LayerAxis(AxisKind.BLOCK, "resid_post"))
HEADLINES = (
        Headline("max |logit diff| last layer vs model", h.summary(S.last_layer_max_abs_logit_diff),
                 "0 (the last layer's lens is the model's own output)"),
        Headline("cross-entropy, last layer", h.metric_last(M.ce),
                 "falls sharply after mid depth (stages of inference)"),
    )
CLAIMS = (
    Claim("max |logit diff|, last layer vs model", "the lens of the last layer is the model's own output",
          "logit lens (nostalgebraist 2020)", h.summary(S.last_layer_max_abs_logit_diff),
          Rule("agrees ≤ 1e-3 logits (float32 round-off); weaker ≤ 0.1; else contradicts",
               agrees=(None, 1e-3), weaker=((1e-3, 0.1),)), figure="metrics", unit="logits"),
    Claim("share of the CE drop made after mid depth", "prediction sharpens late: most of the loss falls after "
          "mid depth", "stages of inference (Lad et al. 2024)", h.drop_share_after_mid(M.ce),
          Rule("agrees ≥ 0.5 (most of the drop after mid depth); weaker in (0, 0.5); contradicts ≤ 0",
               agrees=(0.5, None), weaker=((1e-12, 0.5),)), figure="metrics", unit="share of the drop (0–1)"),
)
