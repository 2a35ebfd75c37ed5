"""Synthetic results folders for the explorer's tests, its benchmark and demos of pages whose study has
not run yet. Every name comes from the study's declaration (``M`` / ``S`` / ``A`` of its module) and
every folder is checked against it, so a renamed metric breaks here, not silently in the explorer.
Values are made up but shaped like a real run: ``n_layers`` layers, ``n_tokens`` tokens (per-token
arrays of that length).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from studies.anisotropy import study as anisotropy
from studies.context_knob import study as context_knob
from studies.context_memory import study as context_memory
from studies.depth_use import study as depth_use
from studies.filler_tokens import study as filler_tokens
from studies.intrinsic_dim import study as intrinsic_dim
from studies.layer_ablation import study as layer_ablation
from studies.linearity import study as linearity
from studies.logit_lens import study as logit_lens
from studies.prediction_gains import study as prediction_gains
from studies.probes_study import study as probes_study
from studies.senses import study as senses
from studies.tuned_lens import study as tuned_lens
from studies.core.contract import StudyResult
from studies.core.registry import get_study
from studies.core.runner import write_study_result

WORDS = np.array(["The", " cat", " sat", " on", " the", " mat", ",", " and", " a", " dog", " ran", "."])
CLASSES = np.array(["determiner", "content", "content", "stopword", "determiner", "content", "punctuation",
                    "stopword", "determiner", "content", "content", "punctuation"])


def _fig(layers, ys: dict, title: str) -> go.Figure:
    fig = go.Figure([go.Scatter(x=list(layers), y=list(v), mode="lines+markers", name=k) for k, v in ys.items()])
    fig.update_layout(title=title)
    return fig


class _Run:
    """What every synthetic study folder of one run shares: its shape, its seeded draws, and how a folder is
    written (checked against the study's declaration first)."""

    def __init__(self, out: Path, model: str, n_layers: int, n_tokens: int, d_model: int, topk_tokens: int | None,
                 seed: int, studies):
        self.rng = np.random.default_rng(seed)
        self.out, self.model, self.studies = out, model, studies
        self.n_layers, self.n_tokens, self.d_model, self.topk_tokens = n_layers, n_tokens, d_model, topk_tokens
        self.L = list(range(n_layers))
        self.depth = np.linspace(0, 1, n_layers)
        self.idx = np.arange(n_tokens)
        self.tokens = WORDS[self.idx % len(WORDS)]
        self.classes = CLASSES[self.idx % len(CLASSES)]
        self.config = {"model": model, "seed": seed}

    def write(self, name, layers=None, metrics=None, summary=None, arrays=None, figures=None):
        if self.studies is not None and name not in self.studies:
            return
        result = StudyResult(model=self.model, corpus="wiki-sample", n_tokens=self.n_tokens,
                             layers=self.L if layers is None else layers,
                             metrics=metrics or {}, summary=summary or {}, arrays=arrays or {})
        problems = get_study(name).result.problems(result)
        if problems:
            raise ValueError(f"synthetic {name}: " + "; ".join(problems))
        write_study_result(self.out / name, name, result, config=self.config, figures=figures)


def write_synthetic_run(out, *, model: str = "synthetic-12l", n_layers: int = 12, n_tokens: int = 300,
                        d_model: int = 64, topk_tokens: int | None = None, seed: int = 0,
                        studies=None) -> Path:
    """One folder per study under ``out``; ``topk_tokens``: how many tokens get logit-lens top-k
    arrays (default all, at most 2000). Returns ``out``."""
    out = Path(out)
    run = _Run(out, model, n_layers, n_tokens, d_model, topk_tokens, seed, studies)
    _prediction_studies(run)  # in this order: the studies draw from one seeded generator
    _geometry_studies(run)
    _sense_and_knob_studies(run)
    return out


def _prediction_studies(run: _Run) -> None:
    """Prediction gains, the logit and tuned lenses, layer ablation."""
    write, rng, L, depth, idx, tokens = run.write, run.rng, run.L, run.depth, run.idx, run.tokens
    n_layers, n_tokens, topk_tokens = run.n_layers, run.n_tokens, run.topk_tokens
    M, S, A = prediction_gains.M, prediction_gains.S, prediction_gains.A
    pr = 0.9 * 10 ** (-0.03 * np.arange(n_layers))
    write("prediction-gains", metrics={M.pr: pr, M.pr_low: pr * 0.97, M.pr_high: pr * 1.03, M.pr_in_sample: pr * 0.9},
          summary={S.pearson_r: -0.991, S.pearson_r_token_id: -0.99, S.decay_ratio: float(pr[0] / pr[-1]),
                   S.slope_log10: -0.03},
          arrays={A.pr: pr}, figures={"main": _fig(L, {"pr": pr}, "PR per layer")})

    M, S, A = logit_lens.M, logit_lens.S, logit_lens.A
    n_top = min(n_tokens, topk_tokens if topk_tokens is not None else 2000)
    ce = 9 - 6 * depth ** 2
    loss = (ce[:, None] + rng.normal(0, 1, (n_layers, n_tokens))).astype(np.float32)
    # the grid's arrays (studies.logit_lens.study.grid_arrays): top-5 over WORDS, shifting with layer and position
    grid_top = ((idx[None, :, None] + np.arange(n_layers)[:, None, None] + np.arange(5)[None, None, :])
                % len(WORDS)).astype(np.uint16)
    grid_probs = np.broadcast_to(np.array([0.4, 0.2, 0.1, 0.05, 0.02], np.float16), grid_top.shape).copy()
    write("logit-lens", metrics={M.ce: ce, M.kl_to_final: ce - ce[-1], M.top1_agreement: depth ** 2,
                                 M.entropy: ce + 0.5, M.median_rank: np.exp(ce / 2)},
          # ce runs 9 → 3 nats under ln V = 10.8 (a 49k vocabulary): the depth claim is judged
          summary={S.last_layer_max_abs_logit_diff: 3e-6, S.last_layer_logit_scale: 25.0, S.uniform_ce: 10.8, S.n_layers_worse_than_uniform: 0,
                   S.late_drop_share: 0.75, S.late_drop_share_low: 0.7, S.late_drop_share_high: 0.8},
          arrays={A.token_index: idx, A.token: tokens, A.token_id: idx % len(WORDS), A.token_ce: loss,
                  A.token_rank: np.exp(loss / 2).astype(np.int32), A.token_top1: np.zeros((n_layers, n_tokens), np.int32),
                  A.topk_rows: idx[:n_top], A.topk_str: WORDS[grid_top[:, :n_top]],
                  A.topk_probs: grid_probs[:, :n_top].astype(np.float32),
                  A.window: idx // 50, A.doc: idx // 100, A.pos: idx % 50,
                  A.token_top1_str: WORDS[grid_top[:, :, 0]],
                  A.token_entropy: (loss + 0.5).astype(np.float32), A.token_kl: np.abs(loss - loss[-1]),
                  A.grid_vocab: WORDS, A.grid_topk: grid_top, A.grid_topk_probs: grid_probs},
          figures={"main": _fig(L, {"ce": ce}, "logit lens CE"), "metrics": _fig(L, {"kl": ce}, "KL")})

    M, S = tuned_lens.M, tuned_lens.S
    write("tuned-lens", metrics={M.ce: ce - 1.5 * (1 - depth), M.kl_to_final: (ce - ce[-1]) * 0.5,
                                 M.logit_lens_ce: ce, M.jacobian_lens_ce: ce - 1.0 * (1 - depth),
                                 M.jacobian_lens_kl: (ce - ce[-1]) * 0.6, M.jacobian_lens_top1_agreement: 0.3 + 0.7 * depth,
                                 M.jacobian_half_rel_diff: 0.2 * (1 - depth), M.jacobian_half_top1_agreement: 0.8 + 0.2 * depth},
          summary={S.jacobian_note: "fitted on 4 training windows (synthetic)", S.jacobian_n_prompts: 4,
                   S.min_ce_gain: 0.1, S.min_ce_gain_low: 0.05, S.min_ce_gain_high: 0.15, S.uniform_ce: 10.8,
                   S.n_layers_worse_than_uniform: 0, S.late_drop_share: 0.6, S.late_drop_share_low: 0.55,
                   S.late_drop_share_high: 0.65},
          figures={"main": _fig(L, {"ce": ce}, "tuned lens CE")})

    M, S = layer_ablation.M, layer_ablation.S
    ret = 0.72 + 0.23 * np.sin(np.pi * depth) ** 0.5
    write("layer-ablation", metrics={M.retained_accuracy_delete: ret, M.retained_accuracy_swap: np.minimum(1, ret + 0.03),
                                     M.delta_ce_delete: 1 - ret, M.delta_ce_swap: 0.8 * (1 - ret)},
          summary={S.retained_min: float(ret.min()), S.retained_max: float(ret.max()),
                   S.retained_min_inner: float(ret[1:-1].min()),
                   S.retained_mean_inner_delete: float(ret[1:-1].mean()),
                   S.retained_mean_inner_delete_low: float(ret[1:-1].mean()) - 0.02,
                   S.retained_mean_inner_delete_high: float(ret[1:-1].mean()) + 0.02,
                   S.retained_mean_inner_swap: float(np.minimum(1, ret + 0.03)[1:-2].mean())})

    M, S = depth_use.M, depth_use.S  # no draws: the other studies' seeded values stay as they were
    rel = 0.6 - 0.4 * (depth > 0.5)
    ratio = depth_use.half_ratio(rel, n_layers) or 0.33  # too few layers for inner halves: a made-up value
    write("depth-use", metrics={M.rel_contribution: rel, M.rel_contribution_low: rel * 0.9,
                                M.rel_contribution_high: rel * 1.1, M.skip_delta_ce: 0.3 * (1 - depth)},
          summary={S.second_half_ratio: ratio, S.second_half_ratio_low: ratio * 0.9,
                   S.second_half_ratio_high: ratio * 1.1, S.parts: "present"},
          figures={"main": _fig(L, {"relative update": rel}, "depth use")})


def _geometry_studies(run: _Run) -> None:
    """Intrinsic dimension, anisotropy, linearity, context memory."""
    write, rng, L, depth, idx, tokens, classes = run.write, run.rng, run.L, run.depth, run.idx, run.tokens, run.classes
    n_layers, n_tokens, d_model = run.n_layers, run.n_tokens, run.d_model
    M, S = intrinsic_dim.M, intrinsic_dim.S
    twonn = 10 + 20 * np.sin(np.pi * depth)
    seq = 8 + 12 * np.sin(np.pi * depth)  # the sequence-level cloud: an interior peak above both ends
    write("intrinsic-dim", metrics={M.twonn: twonn, M.twonn_low: twonn - 2, M.twonn_high: twonn + 2,
                                    M.mle: twonn * 0.9, M.twonn_shuffled: twonn + 8, M.seq_twonn: seq,
                                    M.seq_twonn_low: seq - 1.5, M.seq_twonn_high: seq + 1.5},
          summary={S.twonn_peak_layer: int(np.argmax(twonn)), S.seq_hunchback: float(seq.max() - seq[[0, -1]].max()),
                   S.seq_hunchback_low: float(seq.max() - seq[[0, -1]].max() - 3),
                   S.seq_hunchback_high: float(seq.max() - seq[[0, -1]].max() + 3), S.seq_n_sequences: 300},
          figures={"main": _fig(L, {"twonn": twonn}, "ID")})

    M, A = anisotropy.M, anisotropy.A
    cos = 0.1 + 0.6 * depth
    rogue = np.argsort(-rng.random((n_layers, d_model)), axis=1)[:, :3]
    write("anisotropy", metrics={M.mean_cosine: cos, M.top_pc_share: cos / 2, M.self_similarity: cos + 0.1,
                                 M.intra_sentence_similarity: cos + 0.05, M.mev: cos / 3,
                                 M.rogue_share: 0.2 + 0.6 * depth, M.rogue_dims: rogue.tolist()},
          arrays={A.rogue_dims: rogue,
                  A.cosine_contributions: rng.random((n_layers, d_model)).astype(np.float32) / d_model})

    M, S, A = linearity.M, linearity.S, linearity.A
    lin = 0.99 - 0.05 * np.sin(np.pi * depth[:-1])
    write("linearity", layers=L[:-1],
          metrics={M.linearity: lin, M.linearity_centered: lin - 0.3, M.nonlinearity_mean: 1 - lin},
          summary={S.linearity_mean: float(lin.mean()), S.most_nonlinear_class: "punctuation"},
          arrays={A.token_index: idx, A.token: tokens, A.token_class: classes,
                  A.nonlinearity: rng.random((n_layers - 1, n_tokens)).astype(np.float32)})

    M, S, A = context_memory.M, context_memory.S, context_memory.A
    write("context-memory", metrics={M.all: 0.5 + 0.1 * depth, "punctuation": 0.6 + 0.1 * depth},
          summary={S.top_class: "punctuation", S.corr_with_nonlinearity: 0.31, S.filler_margin_gain: 0.04,
                   S.filler_margin_gain_low: 0.01, S.filler_margin_gain_high: 0.07, S.corr_gain_nonlinearity: 0.31,
                   S.corr_gain_nonlinearity_low: 0.22, S.corr_gain_nonlinearity_high: 0.4},
          arrays={A.test_rows: idx[::2], A.token_scores: rng.random((n_layers, len(idx[::2])))})


def _sense_and_knob_studies(run: _Run) -> None:
    """Senses, filler tokens, the context knob, probes."""
    write, rng, depth, n_layers = run.write, run.rng, run.depth, run.n_layers
    M, S, A = senses.M, senses.S, senses.A
    n_ctx = 60
    proj = rng.normal(size=(n_layers, n_ctx, 2)) + (np.arange(n_ctx) % 2)[None, :, None] * 3 * depth[:, None, None]
    lemma = np.array(["bank", "bass", "crane"])[np.arange(n_ctx) // 20]
    sense = np.array([f"{l}.n.0{1 + i % 2}" for i, l in enumerate(lemma)])
    acc = 0.5 + 0.4 * np.sin(np.pi * depth)
    words = ("bank", "bass", "crane")
    write("senses", metrics={M.knn_accuracy: acc, M.ari: acc - 0.4},
          summary={S.chance: 0.5, S.most_frequent_sense: 0.55, S.best_layer: int(np.argmax(acc)),
                   S.best_knn_accuracy: float(acc.max()), S.n_lemmas: 3, S.n_contexts: n_ctx,
                   S.heldout_knn_accuracy: float(acc.max()) - 0.02, S.sense_margin: float(acc.max()) - 0.57,
                   S.sense_margin_low: float(acc.max()) - 0.62, S.sense_margin_high: float(acc.max()) - 0.52,
                   "nested__sense_margin": [float(acc.max()) - 0.55, float(acc.max()) - 0.56,
                                            float(acc.max()) - 0.57],
                   "nested_n__sense_margin": [20, 40, n_ctx]},
          arrays={A.projection_lemmas: np.array(words),
                  **{A.projection(w): proj[:, lemma == w] for w in words},
                  **{A.projection_senses(w): sense[lemma == w] for w in words},
                  **{A.projection_texts(w): np.array([f"a {w} context"] * (lemma == w).sum()) for w in words}})

    S = filler_tokens.S
    write("filler-tokens", layers=[], summary={S.delta_loss_filler: 0.42, S.delta_loss_random: 0.18,
                                               S.delta_ctx_filler: 0.12, S.delta_ctx_filler_low: 0.05,
                                               S.delta_ctx_filler_high: 0.19, S.delta_ctx_random: 0.1})

    M, S, A = context_knob.M, context_knob.S, context_knob.A
    sep = 0.5 + 0.45 * np.exp(-((depth - 0.5) ** 2) / 0.02)
    alpha = np.linspace(-4, 4, 9)
    write("context-knob", metrics={M.separation: sep},
          summary={S.knob_layer: int(np.argmax(sep)), S.baseline_context_share: 0.6,
                   S.steered_context_share_min: 0.1, S.steered_context_share_max: 0.95,
                   S.steer_moved_share: 0.8, S.steer_moved_share_low: 0.74, S.steer_moved_share_high: 0.86},
          arrays={A.steer_values: alpha, A.steer_context_share: 1 / (1 + np.exp(-alpha)),
                  A.cad_alpha: np.linspace(0, 2, 5), A.cad_context_share: np.linspace(0.6, 0.9, 5)})

    M = probes_study.M
    S = probes_study.S
    write("probes", metrics={M.accuracy: 0.6 + 0.3 * depth, M.selectivity: 0.2 * depth},
          summary={S.mean_selectivity: 0.1, S.mean_selectivity_low: 0.07, S.mean_selectivity_high: 0.13,
                   "nested__mean_selectivity": [0.09, 0.11, 0.1], "nested_n__mean_selectivity": [100, 200, 400]})
