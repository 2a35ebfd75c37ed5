"""What the context knob study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import Claim, Headline, Names, ResultSpec, Rule, array, metric, scalar

M = Names(
    metric("separation", "cross-validated accuracy of the difference-of-means direction (instruction)",
           title='separation of the instructions (difference of means)', unit='accuracy (0–1)'),
    metric("dprime", "d′ of the two instructions along the direction", title='d′ along the direction', unit='d′'),
    metric("logistic_accuracy", "cross-validated accuracy of a logistic probe",
           title='logistic probe accuracy', unit='accuracy (0–1)'),
    metric("direction_cosine", "cosine between the difference-of-means and the logistic direction",
           title='cosine: mean-difference vs logistic direction', unit='cosine'),
)
S = Names(
    scalar("knob_layer", "the layer that separates the instructions best", title='knob layer', unit='layer'),
    scalar("knob_separation", "separation at the knob layer",
           title='separation at the knob layer', unit='accuracy (0–1)'),
    scalar("knob_dprime", "d′ at the knob layer", title='d′ at the knob layer', unit='d′'),
    scalar("knob_logistic_accuracy", "logistic accuracy at the knob layer",
           title='logistic accuracy at the knob layer', unit='accuracy (0–1)'),
    scalar("baseline_context_share", "share of answers following the context, no steering, all prompts",
           title='context share, no steering', unit='share of answers (0–1)'),
    scalar("baseline_context_share_context_instruction", "the same, 'use the context' prompts",
           title="context share, 'use the context' prompts", unit='share of answers (0–1)'),
    scalar("baseline_context_share_memory_instruction", "the same, 'use your knowledge' prompts",
           title="context share, 'use your knowledge' prompts", unit='share of answers (0–1)'),
    scalar("instruction_accuracy", "share of answers that follow their instruction",
           title='answers that follow their instruction', unit='share of answers (0–1)'),
    scalar("steered_context_share_min", "smallest context share over the steering sweep",
           title='steered context share, min', unit='share of answers (0–1)'),
    scalar("steered_context_share_max", "largest context share over the steering sweep",
           title='steered context share, max', unit='share of answers (0–1)'),
    scalar("n_facts", "counterfactual facts used", title='facts used', unit='facts'),
    scalar("n_known", "facts the model gets right without context",
           title='facts known without context', unit='facts'),
    scalar("n_tried", "facts tried", title='facts tried', unit='facts'),
    scalar("cad_context_share_{}", "context share under context-aware decoding with strength α",
           attr="cad_context_share", title='context share, context-aware decoding α = {}', unit='share of answers (0–1)'),
    scalar("precision", "arithmetic of the study's forward passes (lens.runtime.precision)", title='arithmetic'),
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
CLAIMS = (
    Claim("separation of the instructions, best layer", "a 1-D subspace in one layer tells context from prior "
          "knowledge with 85–95% accuracy", "Controllable context sensitivity and the knob behind it",
          h.metric_max(M.separation),
          Rule("agrees ≥ 0.85 (the paper's lower end); weaker in (0.5, 0.85) (above chance); else contradicts",
               agrees=(0.85, None), weaker=((0.5 + 1e-12, 0.85),)), unit="accuracy (0–1)"),
)
