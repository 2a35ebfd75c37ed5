"""Headline numbers per study, each beside the claim from the seed papers it is checked against.

The main job prints one line per study from these, the report puts them in its summary table and the
explorer's overview shows them. A headline reads only a ``ResultRecord`` (``summary`` scalars and
per-layer ``metrics``), so it works for any results folder, old or new; a missing key gives ``None``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Headline:
    study: str
    label: str
    value: Callable  # ResultRecord -> float | str | None
    claim: str


def _summary(key):
    return lambda rec: rec.summary.get(key)


def _metric(name, how):
    def get(rec):
        values = [v for v in rec.metrics.get(name, []) if v is not None]
        return how(values) if values else None
    return get


def _argmax_depth(name):
    """Relative depth (0 = first layer, 1 = last) of the metric's maximum."""
    def get(rec):
        vals = rec.metrics.get(name, [])
        pairs = [(v, i) for i, v in enumerate(vals) if v is not None]
        if len(pairs) < 2:
            return None
        return max(pairs)[1] / (len(vals) - 1)
    return get


def _tuned_gain(rec):
    ce, ll = rec.metrics.get("ce", []), rec.metrics.get("logit_lens_ce", [])
    pairs = [(a, b) for a, b in zip(ce, ll) if a is not None and b is not None]
    return sum(b - a for a, b in pairs) / len(pairs) if pairs else None


def _filler_vs_random(rec):
    f, r = rec.summary.get("delta_loss_filler"), rec.summary.get("delta_loss_random")
    return None if f is None or r is None else f"{_fmt(f)} vs {_fmt(r)}"


HEADLINES: list[Headline] = [
    Headline("prediction-gains", "Pearson r of log PR vs layer (held-out)", _summary("pearson_r"),
             "−0.983 … −0.997 across model families (He & Su 2024)"),
    Headline("prediction-gains", "Pearson r, in-sample fit", _summary("pearson_r_in_sample"),
             "−0.983 … −0.997 (He & Su 2024)"),
    Headline("prediction-gains", "PR decay ratio (first / last layer)", _summary("decay_ratio"),
             "each layer contributes an equal log-gain"),
    Headline("logit-lens", "max |logit diff| last layer vs model", _summary("last_layer_max_abs_logit_diff"),
             "0 (the last layer's lens is the model's own output)"),
    Headline("logit-lens", "cross-entropy, last layer", _metric("ce", lambda v: v[-1]),
             "falls sharply after mid depth (stages of inference)"),
    Headline("tuned-lens", "mean CE gain over the logit lens (nats)", _tuned_gain,
             "> 0: translators beat the raw logit lens at early layers (tuned lens)"),
    Headline("layer-ablation", "retained accuracy, min", _summary("retained_min"),
             "72–95% retained when one layer is deleted or swapped (stages of inference)"),
    Headline("layer-ablation", "retained accuracy, max", _summary("retained_max"),
             "72–95% (stages of inference)"),
    Headline("intrinsic-dim", "TwoNN peak, relative depth", _argmax_depth("twonn"),
             "ID peaks at mid depth (LLM-Microscope; token point clouds)"),
    Headline("intrinsic-dim", "TwoNN maximum", _metric("twonn", max), "tens, far below d_model"),
    Headline("anisotropy", "max mean cosine of random pairs", _metric("mean_cosine", max),
             "high in middle/late layers (Ethayarajh 2019)"),
    Headline("anisotropy", "max share of cosine in top-3 dims", _metric("rogue_share", max),
             "a few rogue dimensions dominate (Timkey & van Schijndel 2021)"),
    Headline("linearity", "mean linearity score l → l+1", _summary("linearity_mean"),
             "≈ 0.99 (Razzhigaev et al. 2024, 'secretly linear')"),
    Headline("linearity", "most nonlinear token class", _summary("most_nonlinear_class"),
             "filler / punctuation tokens (LLM-Microscope)"),
    Headline("senses", "best-layer kNN sense accuracy", _summary("best_knn_accuracy"),
             "above most-frequent-sense baseline, best in middle layers (SenseDict, WiC)"),
    Headline("senses", "most-frequent-sense baseline", _summary("most_frequent_sense"), "baseline"),
    Headline("probes", "best probe accuracy", _metric("accuracy", max), "high with positive selectivity"),
    Headline("probes", "best selectivity", _metric("selectivity", max),
             "> 0 (Hewitt & Liang control task)"),
    Headline("context-memory", "class with most context memory", _summary("top_class"),
             "fillers: punctuation, determiners (LLM-Microscope)"),
    Headline("context-memory", "correlation with nonlinearity", _summary("corr_with_nonlinearity"),
             "positive (LLM-Microscope)"),
    Headline("filler-tokens", "Δ loss removing fillers vs random", _filler_vs_random,
             "fillers matter more than random tokens (LLM-Microscope)"),
    Headline("context-knob", "knob layer", _summary("knob_layer"), "one mid layer (Controllable context sensitivity and the knob behind it)"),
    Headline("context-knob", "max separation", _metric("separation", max), "85–95% accuracy from a 1-D subspace in one layer (same paper)"),
    Headline("context-knob", "steered context share, min…max",
             lambda r: None if r.summary.get("steered_context_share_min") is None else
             f"{_fmt(r.summary['steered_context_share_min'])}…{_fmt(r.summary.get('steered_context_share_max'))}",
             "steering sweeps from prior to context"),
]


def _fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.3g}"
        return f"{value:.3f}"
    return str(value)


def format_value(value) -> str:
    """Numbers to 3 decimals (or 3 significant digits when tiny or huge), ``—`` for missing."""
    return _fmt(value)


def headlines_for(record) -> list[dict]:
    """Rows {study, label, value, text, claim} for one result; values that fail to compute are ``None``."""
    rows = []
    for h in HEADLINES:
        if h.study != record.study:
            continue
        try:
            value = h.value(record)
        except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError):
            value = None
        rows.append({"study": h.study, "label": h.label, "value": value, "text": _fmt(value), "claim": h.claim})
    return rows


def one_line(record) -> str:
    """``label = value`` for the study's headlines, for the main job's summary line."""
    rows = [r for r in headlines_for(record) if r["value"] is not None]
    if not rows:
        keys = list(record.summary)[:3]
        return ", ".join(f"{k}={_fmt(record.summary[k])}" for k in keys) or "no summary"
    return "; ".join(f"{r['label']} = {r['text']}" for r in rows[:3])
