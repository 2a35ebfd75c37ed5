"""What the context knob study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.core.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.core.registry.declaration`)."""

from __future__ import annotations

from studies.reporting import headlines as h
from studies.core import stability
from studies.core.precision import CURVE_COMMAND, Precision
from studies.core.contract import Claim, Headline, Names, ResultSpec, Rule, array, interval_scalars, metric, scalar

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
    *stability.SCALARS,
    *interval_scalars("steer_moved_share", "share of answers moved by steering: the share following the context with "
                      "the knob set at the sweep's context end minus the share with it at the sweep's memory end "
                      "(all prompts; per prompt +1, 0 or −1, averaged)",
                      title="share of answers moved by steering", unit="share of answers (−1–1)",
                      how="facts resampled (both prompts of a fact together)"),
    scalar("steered_accuracy", "the paper's task accuracy under steering: ½ (share following the context at the "
                               "context end + share following the prior at the memory end) = ½ (1 + moved share)",
           title="accuracy of the steered intent", unit="share of answers (0–1)"),
    scalar("steer_moved_share_at_means", "the moved share with the knob set to the two instructions' own mean "
                                         "coordinates instead of the sweep's ends (diagnostic)",
           title="share moved by steering, at the instruction means", unit="share of answers (−1–1)"),
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
        Headline("share of answers moved by steering", h.summary(S.steer_moved_share),
                 "a 1-D knob in one layer switches answers between context and prior (Minder et al.)"),
        Headline("knob layer", h.summary(S.knob_layer),
                 "one layer (Controllable context sensitivity and the knob behind it)"),
        Headline("max separation (diagnostic)", h.metric_max(M.separation),
                 "how well the two instructions' states separate: their wording differs, so near 1 says little"),
        Headline("steered context share, min…max",
                 h.pair(S.steered_context_share_min, S.steered_context_share_max, sep="…"),
                 "steering sweeps from prior to context"),
    )
CLAIMS = (
    Claim("share of answers moved by steering along the knob", "a 1-D subspace in one layer is a knob: setting the "
          "coordinate along it switches the answer between the context's and the prior's",
          "Controllable context sensitivity and the knob behind it (Minder et al. 2025)", h.summary(S.steer_moved_share),
          Rule("agrees ≥ 0.7 (the paper's 85–95% task accuracy as a moved share, 2·acc − 1 = 0.7–0.9); weaker in "
               "(0, 0.7) (steering moves answers, less than the paper's models follow the intent); contradicts ≤ 0",
               agrees=(0.7, None), weaker=((1e-12, 0.7),)),
          low=h.summary(S.steer_moved_share_low), high=h.summary(S.steer_moved_share_high),
          unit="share of answers (−1–1)",
          paper="Minder et al. 2025 (ICLR; arXiv 2411.07404, abstract): fine-tuned on the task, the instruct models "
                "'can solve it with high accuracy (85-95%)'; 'in each model, we identify a 1-D subspace in a single "
                "layer that encodes whether the model follows context or prior knowledge' and 'the exact same "
                "subspace serves as an effective knob in not only that model but also non-fine-tuned instruct and "
                "base models'. The knob is judged by intervening: the coordinate along the subspace is set to a "
                "context or a prior value and the answer (context's or prior's) is scored as the task's accuracy "
                "for the steered intent. Our threshold is the fine-tuned task accuracy (85–95%) read as the share "
                "of answers that follow the intent when steered: with accuracy a for each intent, steering moves "
                "2a − 1 = 0.7–0.9 of the answers from the prior to the context",
          method="states at each prompt's last token (both instructions, every kept fact); the knob: the difference "
                 "of the two instructions' means at the layer that separates them best (cross-validated); the last "
                 "token's coordinate along it set to the two ends of the steering sweep (steer_span instruction gaps "
                 "beyond each instruction's mean); per prompt +1 when the answer follows the context at the context "
                 "end and not at the memory end, −1 the reverse, else 0; value = the mean over prompts, an answer "
                 "following the context = the counterfactual capital's first token outscores the true one's; 95% "
                 "interval: facts resampled 2000 times (a fact's two prompts together); nested N/4, N/2, N: the "
                 "knob refitted on a quarter and a half of the facts, steered on all prompts",
          instrument="the untuned model steered (the paper finds the subspace in a model fine-tuned on the task, "
                     "then transfers it); first-token answers of country → capital facts",
          figure="main", key="steer_moved_share"),
)

# the precision the headline is reported to (issue #38, studies.core.precision): the default sample is the smallest
# size of the curve (sample, value, 95% low, high on smollm2-135m; docs/sample_sizes.md) of at least min_sample (10
# resampling units) whose interval reached it
PRECISION = Precision(
    "share of answers moved by steering along the knob", "share of answers (0–1)",
    h.summary(S.steer_moved_share),
    h.summary(S.steer_moved_share_low),
    h.summary(S.steer_moved_share_high),
    half_width=0.05, knob="max_facts", default=120, scales=True, min_sample=10,
    curve=((60, 0, 0, 0),
           (120, 0, -0.03614, 0.03614),),
    command=CURVE_COMMAND,
    note="the sample is facts (countries and capitals), not tokens; at 60 facts no answer moved and the interval collapsed to [0, 0] (a 'contradicts' where 120 facts say 'undecided'): the default stays 120")
