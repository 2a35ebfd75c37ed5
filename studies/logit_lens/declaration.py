"""What the logit lens study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.core.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.core.registry.declaration`)."""

from __future__ import annotations

import math

from studies.reporting import headlines as h
from studies.core import stability
from studies.core.precision import CURVE_COMMAND, Precision
from studies.core.contract import (AxisKind, Claim, Headline, LayerAxis, Names, ResultSpec, Rule, array, interval_scalars,
                              metric, scalar)

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
    metric("jacobian_ce", "ce of the Jacobian lens of config.jacobian_lens", title="cross-entropy, Jacobian lens",
           unit="nats/token"),
    metric("jacobian_kl_to_final", "kl_to_final of the Jacobian lens", title="KL to the final layer, Jacobian lens",
           unit="nats"),
    metric("jacobian_top1_agreement", "top1_agreement of the Jacobian lens", title="top-1 agreement, Jacobian lens",
           unit="share of tokens (0–1)"),
)
S = Names(
    *stability.SCALARS,
    scalar("last_layer_max_abs_logit_diff", "max |lens of the last layer − the model's logits| (0 expected)",
           title="max |logit diff|, last layer vs model", unit="logits"),
    scalar("last_layer_logit_scale", "max |model logit| over the windows of the last-layer check (the scale its "
                                     "float32 round-off is relative to)", title="max |logit|, last-layer check",
           unit="logits"),
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
    scalar("jacobian_lens", "the Jacobian lens file decoded beside the logit lens (config.jacobian_lens), or none",
           title="Jacobian lens"),
    scalar("uniform_ce", "ln V: the cross-entropy of the uniform distribution over the model's V tokens — a lens "
                         "above it predicts worse than knowing nothing", title="cross-entropy of the uniform "
                         "distribution (ln V)", unit="nats/token"),
    scalar("n_layers_worse_than_uniform", "layers whose lens cross-entropy exceeds ln V",
           title="layers worse than uniform", unit="layers"),
    *interval_scalars("late_drop_share", "share of the lens cross-entropy's fall made after mid depth "
                      "(late_drop_share: the fall from its highest value at or before mid depth down to the last "
                      "layer)",
                      title="share of the CE drop after mid depth", unit="share of the drop (0–1)",
                      how="whole units (bootstrap_unit) resampled"),
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
    # the explorer's token × layer grid (studies.logit_lens.study): axis ``grid`` = the first config.grid_tokens
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
    # the Jacobian lens (Gurnee et al. 2026) of a fitted file (config.jacobian_lens), for the grid and beside the logit lens
    array("jacobian_token_ce", "layer token", "token_ce of the Jacobian lens", title="cross-entropy, Jacobian lens",
          unit="nats"),
    array("jacobian_token_rank", "layer token", "token_rank of the Jacobian lens",
          title="rank of the true token, Jacobian lens", unit="rank (0 = top-1)"),
    array("jacobian_token_kl", "layer token", "token_kl of the Jacobian lens",
          title="KL to the final layer, Jacobian lens", unit="nats"),
    array("jacobian_token_entropy", "layer token", "token_entropy of the Jacobian lens",
          title="entropy of the lens, Jacobian lens", unit="nats"),
    array("jacobian_grid_topk", "layer grid k", "grid_topk of the Jacobian lens", label=True),
    array("jacobian_grid_topk_probs", "layer grid k", "grid_topk_probs of the Jacobian lens", title="probability",
          unit="probability"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A, token_rows=A.token_index, token_text=A.token,
                    layer_axis=LayerAxis(AxisKind.BLOCK, "resid_post"))


def late_drop_share(values) -> float | None:
    """Share of a per-layer cross-entropy's fall made after the middle layer: the fall from its highest value at or
    before mid depth down to the last layer, (CE[mid] − CE[last]) / (max CE[≤ mid] − CE[last]), clipped to 0–1 (0
    when it does not fall); :func:`studies.reporting.headlines.drop_share_after_mid` on a plain list."""
    vals = [float(v) for v in values if v is not None]
    if len(vals) < 3 or not all(math.isfinite(v) for v in vals):
        return None
    mid = len(vals) // 2
    top = max(vals[: mid + 1])
    if not top > vals[-1]:
        return 0.0
    return min(1.0, max(0.0, (vals[mid] - vals[-1]) / (top - vals[-1])))


def _number(value):
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def late_share_value(ce_key: str, share_key: str):
    """The late share a result wrote (``share_key``), else computed from its per-layer ``ce_key`` (an older result)."""
    def get(rec):
        v = _number(rec.summary.get(share_key))
        return v if v is not None else late_drop_share(rec.metrics.get(ce_key, []))
    return get


def worse_than_uniform(ce_key: str, uniform_key: str, instead: str):
    """``applicable`` of a depth-profile claim: a reason when the lens cross-entropy exceeds ln V (the uniform
    distribution's) on most layers — its fall then measures how far the lens is from reading those layers at all,
    not where prediction sharpens — or when the result does not say ln V; None when the lens beats uniform on at
    least half of the layers. ``instead``: where the claim is judged instead."""
    def reason(rec):
        ce = [float(v) for v in rec.metrics.get(ce_key, []) if v is not None]
        if not ce:
            return None  # nothing measured: the rule says not applicable itself
        ln_v = _number(rec.summary.get(uniform_key))
        if ln_v is None:
            return "the result does not record ln V (the uniform distribution's cross-entropy), so whether the lens " \
                   "beats knowing nothing cannot be told"
        worse = sum(v > ln_v for v in ce)
        if worse * 2 > len(ce):
            return (f"the lens is worse than uniform (cross-entropy > ln V = {ln_v:.2f} nats) on {worse} of {len(ce)} "
                    f"layers, so the share of its fall after mid depth measures where the lens starts to read the "
                    f"states, not where prediction sharpens; {instead}")
        return None
    return reason


HEADLINES = (
        Headline("max |logit diff| last layer vs model", h.summary(S.last_layer_max_abs_logit_diff),
                 "0 (the last layer's lens is the model's own output)"),
        Headline("cross-entropy, last layer", h.metric_last(M.ce), "the model's own loss"),
        Headline("layers worse than uniform (CE > ln V)", h.summary(S.n_layers_worse_than_uniform),
                 "a lens worse than uniform on most layers cannot show where prediction sharpens"),
        Headline("share of the CE drop after mid depth", late_share_value(M.ce, S.late_drop_share),
                 "most of the drop after mid depth (stages of inference)"),
    )
DEPTH_PAPER = (
    "Lad et al. 2024 (arXiv 2406.19384 v1, abstract): 'the second half of the model begins with a phase transition, "
    "where hidden representations align more with the vocabulary space due to specialized model components. "
    "Finally, the last layer sharpens the following token distribution' (stages 3–4: prediction ensembling, "
    "residual sharpening; v3: 'prediction ensembling, where hidden states are aggregated into plausible next-token "
    "predictions'). Neither paper reports a share of the loss drop: that share is this claim made measurable. "
    "The depth profile it is read from is the one Belrose et al. 2023 report for the logit and the tuned lens: the "
    "lens's cross-entropy to the true next token at each layer on held-out text (their code, "
    "tuned_lens/scripts/eval_loop.py: per-layer 'baseline_ce' (logit lens) and 'lens_ce', averaged over tokens and "
    "reported in bits per byte); they call the logit lens 'brittle' (abstract) and train the tuned lens because the "
    "raw unembedding misreads early layers")
def _relative_logit_diff(rec):
    diff, scale = rec.summary.get(S.last_layer_max_abs_logit_diff), rec.summary.get(S.last_layer_logit_scale)
    if not isinstance(diff, (int, float)) or not isinstance(scale, (int, float)) or not scale > 0:
        return None
    return diff / scale


def _logit_scale_recorded(rec):
    if rec.summary.get(S.last_layer_max_abs_logit_diff) is not None and rec.summary.get(S.last_layer_logit_scale) is None:
        return ("the result records the difference but not the logits' scale it is round-off of (a result from before "
                "the scale was recorded): rerun the study")
    return None


DEPTH_RULE = Rule("agrees ≥ 0.5 (most of the drop after mid depth); weaker in (0, 0.5); contradicts ≤ 0",
                  agrees=(0.5, None), weaker=((1e-12, 0.5),))
CLAIMS = (
    Claim("max |logit diff| / max |logit|, last layer vs model", "the lens of the last layer is the model's own "
          "output", "logit lens (nostalgebraist 2020)", _relative_logit_diff,
          Rule("agrees ≤ 1e-4 of the largest logit (float32 round-off of two products of one state); weaker ≤ 1e-2; "
               "else contradicts", agrees=(None, 1e-4), weaker=((1e-4, 1e-2),)), figure="metrics",
          unit="share of max |logit|", applicable=_logit_scale_recorded,
          paper="a check, not a finding: decoding the last layer's states through the final norm and unembedding is "
                "by construction the model's own forward pass (nostalgebraist 2020)",
          method="max |lens logits of the last layer − the model's logits| over the first check_windows windows, "
                 "re-run whole, over the largest |logit| there: float32 round-off grows with the logits' size (a "
                 "fixed 1e-3 logits read Gemma 3's 262k-word head, 0.002 of logits near 30, as 'weaker')"),
    Claim("share of the CE drop made after mid depth (logit lens)", "prediction sharpens in the second half of the "
          "model: most of the fall of the lens's cross-entropy comes after mid depth",
          "stages of inference (Lad et al. 2024); tuned lens (Belrose et al. 2023)",
          late_share_value(M.ce, S.late_drop_share), DEPTH_RULE,
          low=h.summary(S.late_drop_share_low), high=h.summary(S.late_drop_share_high), figure="metrics",
          unit="share of the drop (0–1)", paper=DEPTH_PAPER,
          method="logit-lens cross-entropy per layer (resid_post, nats/token, mean over the decoded tokens); share = "
                 "(CE[mid] − CE[last]) / (max CE[layers ≤ mid] − CE[last]), clipped to 0–1; 95% interval: whole "
                 "documents (windows when fewer than 10) resampled 200 times, the per-layer means and the share "
                 "recomputed on each; nested N/4, N/2, N of the same units",
          applicable=worse_than_uniform(M.ce, S.uniform_ce, "judged on the tuned lens instead (tuned-lens study)"),
          key="late_drop_share"),
)

# the precision the headline is reported to (issue #38, studies.core.precision): the default sample is the smallest
# size of the curve (sample, value, 95% low, high on smollm2-135m; docs/sample_sizes.md) of at least min_sample (10
# resampling units) whose interval reached it
PRECISION = Precision(
    "cross-entropy, last layer", "nats/token",
    h.metric_last(M.ce),
    h.metric_last(M.ce_low),
    h.metric_last(M.ce_high),
    half_width=0.25, knob="sample_tokens", default=4096, scales=True, min_sample=1280, missed=(1280, 2048),
    curve=((256, 3.108, 2.68, 3.536),
           (512, 3.022, 2.738, 3.421),
           (1280, 3.157, 2.898, 3.38),
           (2048, 3.212, 3.021, 3.408),
           (4096, 3.261, 3.143, 3.394),),
    command=CURVE_COMMAND,
    note="the last layer's cross-entropy (the model's own loss) is the headline with an interval; re-checked on a 4000-token store of SmolLM2 (seed 0), 1280 and 2048 decoded tokens gave ±0.39 and ±0.30 nats where the main job's store gave ±0.24 and ±0.19, so the default stays 4096 (±0.19 there, ±0.13 on the main job's store)")
