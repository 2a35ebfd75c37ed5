"""What the filler tokens study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.core.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.core.registry.declaration`)."""

from __future__ import annotations

from studies.reporting import headlines as h
from studies.core import stability
from studies.core.precision import CURVE_COMMAND, Precision
from studies.reporting.headlines import pair
from studies.core.contract import (AxisKind, Claim, Headline, LayerAxis, Names, ResultSpec, Rule, array, interval_scalars,
                              scalar)

S = Names(
    scalar("loss_original", "loss of the common tokens in the original text, nats/token",
           title='loss, original text', unit='nats/token'),
    scalar("loss_filler", "their loss with filler tokens removed", title='loss, fillers removed', unit='nats/token'),
    scalar("loss_random", "their loss with as many random tokens removed (mean over draws)",
           title='loss, random tokens removed', unit='nats/token'),
    scalar("delta_loss_filler", "loss_filler − loss_original", title='Δ loss, fillers removed', unit='nats/token'),
    scalar("delta_loss_random", "loss_random − loss_original",
           title='Δ loss, random tokens removed', unit='nats/token'),
    scalar("delta_loss_filler_ci_low", "bootstrap interval over chunks of delta_loss_filler, low",
           title='Δ loss fillers, 95% interval low', unit='nats/token'),
    scalar("delta_loss_filler_ci_high", "bootstrap interval of delta_loss_filler, high",
           title='Δ loss fillers, 95% interval high', unit='nats/token'),
    scalar("delta_loss_random_ci_low", "bootstrap interval over chunks of delta_loss_random, low",
           title='Δ loss random, 95% interval low', unit='nats/token'),
    scalar("delta_loss_random_ci_high", "bootstrap interval of delta_loss_random, high",
           title='Δ loss random, 95% interval high', unit='nats/token'),
    scalar("filler_minus_random", "delta_loss_filler − delta_loss_random",
           title='Δ loss fillers − Δ loss random', unit='nats/token'),
    scalar("n_scored", "tokens scored (kept by both removals)", title='scored tokens', unit='tokens'),
    scalar("n_chunks", "chunks of seq_len tokens", title='chunks', unit='chunks'),
    scalar("removed_share", "share of tokens removed as filler",
           title='share removed as filler', unit='share of tokens (0–1)'),
    scalar("precision", "arithmetic of the forward passes (lens.runtime.precision)", title='arithmetic'),
    scalar("loss_all_{}", "mean loss over all remaining tokens of a condition (the composition effect)",
           attr="loss_all", title='loss over all remaining tokens, {}', unit='nats/token'),
    # the judged comparison: removal in each chunk's context only, its intact continuation scored
    scalar("loss_cont_original", "loss of the intact continuations after the intact context, nats/token",
           title="loss of the continuation, intact context", unit="nats/token"),
    *interval_scalars("delta_ctx_filler", "loss change of the intact continuation when fillers are removed from its "
                      "context (the judged number)",
                      title="Δ loss of the continuation, fillers removed from the context", unit="nats/token",
                      how="resampling documents (chunks when fewer than 10)"),
    *interval_scalars("delta_ctx_random", "loss change of the intact continuation when as many random context tokens "
                      "are removed (our control, not the paper's)",
                      title="Δ loss of the continuation, random context tokens removed (our control)",
                      unit="nats/token"),
    *interval_scalars("ctx_filler_minus_random", "delta_ctx_filler − delta_ctx_random (our control, not judged)",
                      title="Δ loss fillers − Δ loss random (context only, our control)", unit="nats/token",
                      how="(paired)"),
    scalar("n_cont_scored", "continuation tokens scored in every context condition", title="scored continuation "
           "tokens", unit="tokens"),
    scalar("ctx_removed_share", "share of context tokens removed as filler",
           title="share of the context removed as filler", unit="share of tokens (0–1)"),
    scalar("units", "what the judged intervals resample: doc (documents) or window (chunks)",
           title="resampled units"),
    scalar("n_units", "documents (or chunks) the judged intervals resample", title="resampled units, count",
           unit="units"),
    *stability.SCALARS,
)
A = Names(
    array("chunk_delta_filler", "draw", "mean loss change per chunk and random draw (its common tokens), "
                                        "filler removed"),
    array("chunk_delta_random", "draw", "mean loss change per chunk and random draw, random tokens removed"),
)

RESULT = ResultSpec(summary=S, arrays=A, layer_axis=LayerAxis(AxisKind.NONE, ""))
HEADLINES = (
    Headline("Δ loss of the continuation, fillers removed from the context", h.summary(S.delta_ctx_filler),
             "removing fillers degrades the model against the intact input (LLM-Microscope)"),
    Headline("Δ loss, fillers vs random removed from the context (our control)",
             pair(S.delta_ctx_filler, S.delta_ctx_random),
             "not the paper's comparison: this project's random-token control"),
    Headline("Δ loss removing fillers vs random, everywhere (kept tokens' own contexts)",
             pair(S.delta_loss_filler, S.delta_loss_random),
             "the older measure: tokens kept by both removals, each scored after its shortened prefix"),
)


def _no_context_result(rec):
    if rec.summary.get(S.delta_ctx_filler) is None:
        return "no context-only removal in this result (a result from before #37): rerun the study"
    return None


CLAIMS = (
    Claim("Δ loss of the intact continuation, fillers removed from the context",
          "removing filler tokens (punctuation, articles, stopwords) from the input degrades the model against "
          "the intact input", "LLM-Microscope (Razzhigaev et al. 2025, arXiv:2502.15007)",
          h.summary(S.delta_ctx_filler),
          Rule("agrees > 0 (the continuation is predicted worse without the context's fillers); else contradicts",
               agrees=(1e-12, None)),
          low=h.summary(S.delta_ctx_filler_low), high=h.summary(S.delta_ctx_filler_high), unit="nats/token",
          paper="accuracy on MMLU and BABILong-4k with tokens of a class removed from the input, against the intact "
                "input: 'removing these tokens — especially stopwords, articles, and commas — consistently degrades "
                "performance on MMLU and BABILong-4k, even if removing only irrelevant tokens' (abstract). The "
                "paper's control is the intact input; it compares no random-token removal",
          method="each chunk of seq_len tokens split into a context (its first context_share) and a continuation; "
                 "fillers removed from the context only; the mean next-token loss of the continuation's tokens "
                 "(the same tokens and targets in both conditions) minus the same with the intact context; 95% "
                 "interval resampling documents (chunks when fewer than 10). Beside it, not judged: as many random "
                 "context tokens removed (our control) and the difference of the two",
          instrument="next-token loss of an intact continuation on running text, not the paper's MMLU / BABILong "
                     "accuracy",
          applicable=_no_context_result, key=S.delta_ctx_filler),
)

# the precision the headline is reported to (issue #38, studies.core.precision): the default sample is the smallest
# size of the curve (sample, value, 95% low, high on smollm2-135m; docs/sample_sizes.md) of at least min_sample (10
# resampling units) whose interval reached it
PRECISION = Precision(
    "Δ loss of the intact continuation, fillers removed from the context", "nats/token",
    h.summary(S.delta_ctx_filler),
    h.summary(S.delta_ctx_filler_low),
    h.summary(S.delta_ctx_filler_high),
    half_width=0.1, knob="sample_tokens", default=2000, scales=True, min_sample=1280,
    curve=((1000, 0.3577, 0.2437, 0.4623),
           (2000, 0.3519, 0.2697, 0.4326),
           (4000, 0.317, 0.2416, 0.3995),
           (20000, 0.3405, 0.3066, 0.3756),),
    command=CURVE_COMMAND,
    note="re-checked on another draw of the corpus' windows (--sample-seed 1): ±0.071 at 2000 tokens")
