"""What the filler tokens study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.headlines import pair
from studies.contract import AxisKind, Claim, Headline, LayerAxis, Names, ResultSpec, Rule, array, scalar

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
)
A = Names(
    array("chunk_delta_filler", "draw", "mean loss change per chunk and random draw (its common tokens), "
                                        "filler removed"),
    array("chunk_delta_random", "draw", "mean loss change per chunk and random draw, random tokens removed"),
)

RESULT = ResultSpec(summary=S, arrays=A, layer_axis=LayerAxis(AxisKind.NONE, ""))
HEADLINES = (Headline("Δ loss removing fillers vs random", pair(S.delta_loss_filler, S.delta_loss_random),
                        "fillers matter more than random tokens (LLM-Microscope)"),)
CLAIMS = (
    Claim("Δ loss fillers − Δ loss random", "removing filler tokens hurts more than removing as many random tokens",
          "LLM-Microscope (Razzhigaev et al. 2025)", h.difference(S.delta_loss_filler, S.delta_loss_random),
          Rule("agrees > 0 (fillers matter more); else contradicts", agrees=(1e-12, None)), unit="nats/token"),
)
