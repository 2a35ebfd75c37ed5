"""Synthetic results folders with the keys every study fixes (issues 3–5), for the explorer's tests,
its benchmark and demos of pages whose study has not run yet. Values are made up but shaped like a
real run: ``n_layers`` layers, ``n_tokens`` tokens (per-token arrays of that length).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from studies.results import write_result

WORDS = np.array(["The", " cat", " sat", " on", " the", " mat", ",", " and", " a", " dog", " ran", "."])
CLASSES = np.array(["determiner", "content", "content", "stopword", "determiner", "content", "punctuation",
                    "stopword", "determiner", "content", "content", "punctuation"])


def _fig(layers, ys: dict, title: str) -> go.Figure:
    fig = go.Figure([go.Scatter(x=list(layers), y=list(v), mode="lines+markers", name=k) for k, v in ys.items()])
    fig.update_layout(title=title)
    return fig


def write_synthetic_run(out, *, model: str = "synthetic-12l", n_layers: int = 12, n_tokens: int = 300,
                        d_model: int = 64, topk_tokens: int | None = None, seed: int = 0,
                        studies=None) -> Path:
    """One folder per study under ``out``; ``topk_tokens``: how many tokens get logit-lens top-k
    arrays (default all, at most 2000). Returns ``out``."""
    rng = np.random.default_rng(seed)
    out = Path(out)
    L = list(range(n_layers))
    depth = np.linspace(0, 1, n_layers)
    idx = np.arange(n_tokens)
    tokens = WORDS[idx % len(WORDS)]
    classes = CLASSES[idx % len(CLASSES)]
    common = dict(model=model, corpus="wiki-sample", n_tokens=n_tokens, config={"model": model, "seed": seed})

    def want(name):
        return studies is None or name in studies

    if want("prediction-gains"):
        pr = 0.9 * 10 ** (-0.03 * np.arange(n_layers))
        write_result(out / "prediction-gains", study="prediction-gains", layers=L, **common,
                     metrics={"pr": pr, "pr_low": pr * 0.97, "pr_high": pr * 1.03, "pr_in_sample": pr * 0.9},
                     summary={"pearson_r": -0.991, "decay_ratio": float(pr[0] / pr[-1]), "slope_log10": -0.03},
                     arrays={"pr": pr}, figures={"main": _fig(L, {"pr": pr}, "PR per layer")})
    if want("logit-lens"):
        n_top = min(n_tokens, topk_tokens if topk_tokens is not None else 2000)
        ce = 9 - 6 * depth ** 2
        loss = (ce[:, None] + rng.normal(0, 1, (n_layers, n_tokens))).astype(np.float32)
        rank = np.exp(loss / 2).astype(np.float32)
        write_result(out / "logit-lens", study="logit-lens", layers=L, **common,
                     metrics={"ce": ce, "kl_to_final": ce - ce[-1], "top1_agreement": depth ** 2,
                              "entropy": ce + 0.5, "median_rank": np.exp(ce / 2)},
                     summary={"last_layer_max_abs_logit_diff": 3e-6},
                     arrays={"token": tokens, "token_id": idx % len(WORDS), "token_ce": loss,
                             "token_rank": rank.astype(np.int32), "token_top1": np.zeros((n_layers, n_tokens), np.int32),
                             "topk_rows": idx[:n_top], "topk_str": np.broadcast_to(WORDS[:5], (n_layers, n_top, 5)).copy(),
                             "topk_probs": np.tile(np.array([0.4, 0.2, 0.1, 0.05, 0.02]), (n_layers, n_top, 1))},
                     figures={"main": _fig(L, {"ce": ce}, "logit lens CE"), "metrics": _fig(L, {"kl": ce}, "KL")})
    if want("tuned-lens"):
        ce = 9 - 6 * depth ** 2
        write_result(out / "tuned-lens", study="tuned-lens", layers=L, **common,
                     metrics={"ce": ce - 1.5 * (1 - depth), "kl_to_final": (ce - ce[-1]) * 0.5, "logit_lens_ce": ce},
                     summary={}, figures={"main": _fig(L, {"ce": ce}, "tuned lens CE")})
    if want("layer-ablation"):
        ret = 0.72 + 0.23 * np.sin(np.pi * depth) ** 0.5
        write_result(out / "layer-ablation", study="layer-ablation", layers=L, **common,
                     metrics={"retained_accuracy_delete": ret, "retained_accuracy_swap": np.minimum(1, ret + 0.03),
                              "delta_ce_delete": 1 - ret, "delta_ce_swap": 0.8 * (1 - ret)},
                     summary={"retained_min": float(ret.min()), "retained_max": float(ret.max())})
    if want("intrinsic-dim"):
        twonn = 10 + 20 * np.sin(np.pi * depth)
        write_result(out / "intrinsic-dim", study="intrinsic-dim", layers=L, **common,
                     metrics={"twonn": twonn, "twonn_low": twonn - 2, "twonn_high": twonn + 2, "mle": twonn * 0.9,
                              "twonn_shuffled": twonn + 8}, summary={"peak_layer": int(np.argmax(twonn))},
                     figures={"main": _fig(L, {"twonn": twonn}, "ID")})
    if want("anisotropy"):
        cos = 0.1 + 0.6 * depth
        rogue = np.argsort(-rng.random((n_layers, d_model)), axis=1)[:, :3]
        write_result(out / "anisotropy", study="anisotropy", layers=L, **common,
                     metrics={"mean_cosine": cos, "top_pc_share": cos / 2, "self_similarity": cos + 0.1,
                              "intra_sentence_similarity": cos + 0.05, "mev": cos / 3, "rogue_share": 0.2 + 0.6 * depth,
                              "rogue_dims": rogue.tolist()}, summary={},
                     arrays={"rogue_dims": rogue,
                             "cosine_contributions": rng.random((n_layers, d_model)).astype(np.float32) / d_model})
    if want("linearity"):
        T = L[:-1]
        lin = 0.99 - 0.05 * np.sin(np.pi * depth[:-1])
        write_result(out / "linearity", study="linearity", layers=T, **common,
                     metrics={"linearity": lin, "linearity_centered": lin - 0.3, "nonlinearity_mean": 1 - lin},
                     summary={"linearity_mean": float(lin.mean()), "most_nonlinear_class": "punctuation"},
                     arrays={"token_index": idx, "token": tokens, "token_class": classes,
                             "nonlinearity": rng.random((len(T), n_tokens)).astype(np.float32)})
    if want("context-memory"):
        write_result(out / "context-memory", study="context-memory", layers=L, **common,
                     metrics={"all": 0.5 + 0.1 * depth, "punctuation": 0.6 + 0.1 * depth},
                     summary={"top_class": "punctuation", "corr_with_nonlinearity": 0.31},
                     arrays={"test_rows": idx[::2], "token_scores": rng.random((n_layers, len(idx[::2])))})
    if want("senses"):
        n_ctx = 60
        proj = rng.normal(size=(n_layers, n_ctx, 2)) + (np.arange(n_ctx) % 2)[None, :, None] * 3 * depth[:, None, None]
        lemma = np.array(["bank", "bass", "crane"])[np.arange(n_ctx) // 20]
        sense = np.array([f"{l}.n.0{1 + i % 2}" for i, l in enumerate(lemma)])
        acc = 0.5 + 0.4 * np.sin(np.pi * depth)
        write_result(out / "senses", study="senses", layers=L, **common,
                     metrics={"knn_accuracy": acc, "ari": acc - 0.4},
                     summary={"chance": 0.5, "most_frequent_sense": 0.55, "best_layer": int(np.argmax(acc)),
                              "best_knn_accuracy": float(acc.max()), "n_lemmas": 3, "n_contexts": n_ctx},
                     arrays={"projection_lemmas": np.array(["bank", "bass", "crane"]),
                             **{f"proj__{w}": proj[:, lemma == w] for w in ("bank", "bass", "crane")},
                             **{f"proj_senses__{w}": sense[lemma == w] for w in ("bank", "bass", "crane")},
                             **{f"proj_texts__{w}": np.array([f"a {w} context"] * (lemma == w).sum())
                                for w in ("bank", "bass", "crane")}})
    if want("filler-tokens"):
        write_result(out / "filler-tokens", study="filler-tokens", layers=[], **common, metrics={},
                     summary={"delta_loss_filler": 0.42, "delta_loss_random": 0.18})
    if want("context-knob"):
        sep = 0.5 + 0.45 * np.exp(-((depth - 0.5) ** 2) / 0.02)
        alpha = np.linspace(-4, 4, 9)
        write_result(out / "context-knob", study="context-knob", layers=L, **common, metrics={"separation": sep},
                     summary={"knob_layer": int(np.argmax(sep)), "baseline_context_share": 0.6,
                              "steered_context_share_min": 0.1, "steered_context_share_max": 0.95},
                     arrays={"steer_values": alpha, "steer_context_share": 1 / (1 + np.exp(-alpha)),
                             "cad_alpha": np.linspace(0, 2, 5), "cad_context_share": np.linspace(0.6, 0.9, 5)})
    if want("probes"):
        write_result(out / "probes", study="probes", layers=L, **common,
                     metrics={"accuracy": 0.6 + 0.3 * depth, "selectivity": 0.2 * depth}, summary={})
    return out
