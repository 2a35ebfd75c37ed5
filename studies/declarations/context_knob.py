"""What the context knob study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import Headline, Names, ResultSpec, array, metric, scalar

M = Names(
    metric("separation", "cross-validated accuracy of the difference-of-means direction (instruction)"),
    metric("dprime", "d′ of the two instructions along the direction"),
    metric("logistic_accuracy", "cross-validated accuracy of a logistic probe"),
    metric("direction_cosine", "cosine between the difference-of-means and the logistic direction"),
)
S = Names(
    scalar("knob_layer", "the layer that separates the instructions best"),
    scalar("knob_separation", "separation at the knob layer"),
    scalar("knob_dprime", "d′ at the knob layer"),
    scalar("knob_logistic_accuracy", "logistic accuracy at the knob layer"),
    scalar("baseline_context_share", "share of answers following the context, no steering, all prompts"),
    scalar("baseline_context_share_context_instruction", "the same, 'use the context' prompts"),
    scalar("baseline_context_share_memory_instruction", "the same, 'use your knowledge' prompts"),
    scalar("instruction_accuracy", "share of answers that follow their instruction"),
    scalar("steered_context_share_min", "smallest context share over the steering sweep"),
    scalar("steered_context_share_max", "largest context share over the steering sweep"),
    scalar("n_facts", "counterfactual facts used"),
    scalar("n_known", "facts the model gets right without context"),
    scalar("n_tried", "facts tried"),
    scalar("cad_context_share_{}", "context share under context-aware decoding with strength α",
           attr="cad_context_share"),
    scalar("precision", "arithmetic of the study's forward passes (lens.runtime.precision)"),
)
A = Names(
    array("steer_values", "step", "coordinate along the knob set at the knob layer"),
    array("steer_context_share", "step", "context share per steering value, all prompts"),
    array("steer_context_share_context_instruction", "step", "the same, 'use the context' prompts"),
    array("steer_context_share_memory_instruction", "step", "the same, 'use your knowledge' prompts"),
    array("proj_mean", "layer instruction", "mean projection on the direction per instruction (context, memory)"),
    array("knob_direction", "d_model", "the knob direction at the knob layer"),
    array("cad_alpha", "alpha", "context-aware decoding strengths"),
    array("cad_context_share", "alpha", "context share per strength"),
    array("countries", "fact", "the countries", label=True),
    array("capitals", "fact", "their capitals", label=True),
    array("counterfactuals", "fact", "the capital named in each counterfactual context", label=True),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A)
HEADLINES = (
        Headline("knob layer", h.summary(S.knob_layer),
                 "one mid layer (Controllable context sensitivity and the knob behind it)"),
        Headline("max separation", h.metric_max(M.separation),
                 "85–95% accuracy from a 1-D subspace in one layer (same paper)"),
        Headline("steered context share, min…max",
                 h.pair(S.steered_context_share_min, S.steered_context_share_max, sep="…"),
                 "steering sweeps from prior to context"),
    )
CLAIMS = ()
