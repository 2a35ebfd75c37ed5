"""What the depth-use study declares, as plain data: its result names with labels and units, its layer axis,
headlines and judged claim (:mod:`studies.core.contract`). Imports no torch and no compute code: the explorer and
the report read it without loading the study (:func:`studies.core.registry.declaration`)."""

from __future__ import annotations

from studies.core import stability
from studies.core.precision import Precision
from studies.core.contract import (AxisKind, Claim, Headline, LayerAxis, Names, ResultSpec, Rule, array,
                                   interval_scalars, metric, scalar)
from studies.reporting import headlines as h

_REL = "relative update (‖Δ‖ / ‖residual‖)"

M = Names(
    metric("rel_contribution", "mean over tokens of ||h_{l+1} − h_l|| / ||h_l|| (block l's update over its input)",
           title="relative update of block l (attention + MLP)", unit=_REL),
    metric("rel_contribution_low", "95% interval of rel_contribution, whole documents (windows when fewer than 10) "
                                   "resampled, low", title="relative update, 95% interval low", unit=_REL),
    metric("rel_contribution_high", "95% interval of rel_contribution, high",
           title="relative update, 95% interval high", unit=_REL),
    metric("rel_attn", "mean over tokens of ||a_l|| / ||h_l||, a_l = resid_mid − resid_pre (None where the family "
                       "has no resid_mid)", title="relative update of block l's attention", unit=_REL),
    metric("rel_mlp", "mean over tokens of ||m_l|| / ||h_l + a_l||, m_l = resid_post − resid_mid (None where the "
                      "family has no resid_mid)", title="relative update of block l's MLP", unit=_REL),
    metric("skip_future_effect", "block l skipped: the relative change of every later block's update "
                                 "||Δ'_k − Δ_k|| / ||Δ_k||, averaged over tokens and over the later blocks k > l "
                                 "(None for the last block)",
           title="block l skipped: change of the later blocks' updates", unit="relative change"),
    metric("skip_delta_ce", "block l skipped: output cross-entropy to the true next token − intact, nats/token",
           title="block l skipped: Δ cross-entropy", unit="nats/token"),
)
S = Names(
    *stability.SCALARS,
    *interval_scalars("second_half_ratio", "mean relative update of the second half's inner blocks over the first "
                      "half's (inner: blocks 1..L-2; halves split at L/2)",
                      title="relative update, second half / first half", unit="ratio",
                      how="whole documents (windows when fewer than 10) resampled"),
    scalar("skip_effect_half_ratio", "mean skip_future_effect of the second half's inner blocks over the first "
                                     "half's (blocks with a later block only)",
           title="effect of a skip on later blocks, second half / first half", unit="ratio"),
    scalar("skip_delta_ce_first_half", "mean skip_delta_ce over the first half's inner blocks",
           title="Δ CE of a skip, first half (mean)", unit="nats/token"),
    scalar("skip_delta_ce_second_half", "mean skip_delta_ce over the second half's inner blocks",
           title="Δ CE of a skip, second half (mean)", unit="nats/token"),
    scalar("base_ce", "cross-entropy of the intact model on the skip sample, nats/token",
           title="cross-entropy, intact model", unit="nats/token"),
    scalar("parts", "'present', or why the attention and MLP parts are absent in this family",
           title="attention and MLP parts"),
    scalar("n_tokens_updates", "tokens the relative updates average over", title="tokens (relative updates)",
           unit="tokens"),
    scalar("n_tokens_skip", "tokens the skip scan ran on", title="tokens (skip scan)", unit="tokens"),
    scalar("units", "what the interval resamples: doc or window", title="resampled units"),
    scalar("n_units", "documents (or windows) resampled", title="resampled units, count", unit="units"),
    scalar("halves", "which blocks each half holds", title="halves"),
    scalar("replayed", "whether the skip variants replayed blocks from one recorded pass (else whole forward passes)",
           title="skip variants replayed"),
)
A = Names(
    array("layers", "layer", "block ids"),
    array("skip_effect", "layer effect_layer", "(block skipped l, later block k): mean over tokens of the relative "
                                               "change of block k's update, NaN for k ≤ l",
          title="block l skipped: relative change of block k's update", unit="relative change"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A,
                    layer_axis=LayerAxis(AxisKind.BLOCK, "resid_post", "its update h_{l+1} − h_l"))

#: "much less": the second half's inner blocks at most half the first half's relative update
MUCH_LESS = 0.5
HALF_RULE = Rule(f"agrees ≤ {MUCH_LESS} (the second half's blocks update the residual by at most half as much as "
                 f"the first half's: 'much less'); weaker in ({MUCH_LESS}, 1): less, not much less; contradicts ≥ 1: "
                 "the second half contributes as much or more",
                 agrees=(None, MUCH_LESS), weaker=((MUCH_LESS, 1.0),))

HEADLINES = (
    Headline("relative update, second half / first half (inner blocks)", h.summary(S.second_half_ratio),
             "second half contributes much less, with a sharp transition (Csordás, Manning & Potts 2025)"),
    Headline("effect of skipping a block on the later blocks, second half / first half",
             h.summary(S.skip_effect_half_ratio),
             "skipping a second-half layer changes later computation much less (Csordás et al. 2025, Fig. 3)"),
    Headline("Δ cross-entropy of skipping a second-half block (mean)", h.summary(S.skip_delta_ce_second_half),
             "beside the first half's: skipping late layers changes the output less"),
)
CLAIMS = (
    Claim("relative update, second half / first half", "layers in the second half contribute much less than those "
          "in the first half, with a clear phase transition between the halves",
          "Do Language Models Use Their Depth Efficiently? (Csordás, Manning & Potts, NeurIPS 2025)",
          h.summary(S.second_half_ratio), HALF_RULE,
          low=h.summary(S.second_half_ratio_low), high=h.summary(S.second_half_ratio_high), unit="ratio",
          paper="the mean relative contribution of each layer, ||a_l + m_l|| / ||h_l|| averaged over tokens (and "
                "||a_l|| / ||h_l||, ||m_l|| / ||h_l + a_l|| for the sub-layers), drawn per layer for Llama 3.1, Qwen 3 "
                "and OLMo 2 (Fig. 2 and the appendix; reference code analyze_norms.py): the second half's bars are much "
                "lower than the first half's, with a sharp transition near the middle. The paper states no single "
                "number for it",
          method="ours: the same per-token ratio ||h_{l+1} − h_l|| / ||h_l|| (h_l = block l's input), averaged over "
                 "every token of whole windows drawn at random; one number from that profile: the mean over the "
                 "second half's inner blocks over the mean over the first half's (inner: blocks 1..L-2, the first "
                 "block's update of the embeddings and the last block's unembedding-facing update left out; halves "
                 "split at L/2). 95% interval: whole documents (windows when fewer than 10) resampled; nested N/4, "
                 "N/2, N on documents",
          instrument="one number condensed from the paper's per-layer profile (the paper judges its figure by eye): "
                     "the ratio of the halves' means, ≤ 0.5 read as 'much less'",
          key=S.second_half_ratio),
)

PRECISION = Precision(
    "relative update, second half / first half", "ratio", h.summary(S.second_half_ratio),
    h.summary(S.second_half_ratio_low), h.summary(S.second_half_ratio_high),
    half_width=0.02, knob="sample_tokens", default=1280, scales=True, min_sample=1280,
    curve=((640, 0.8307, 0.8116, 0.8479),
           (1280, 0.8277, 0.8182, 0.8379),
           (2560, 0.8229, 0.8151, 0.8316),
           (5120, 0.8186, 0.8118, 0.8255)),
    command="for n in 640 1280 2560 5120; do LENS_NUM_THREADS=1 lens study depth-use --model smollm2-135m --corpus "
            "wiki-sample --param sample_tokens=$n --param skip_tokens=0 --out /tmp/h4/curve-$n; done",
    note="the judged ratio reads the relative updates only (one forward pass), so the curve ran without the skip "
         "scan; 640 tokens are 5 windows, under the ten units an interval rests on")
