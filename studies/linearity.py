"""Study: token linearity between consecutive layers, and per-token nonlinearity by token class.

For every pair of consecutive ``resid_post`` layers l → l+1 (special tokens left out): the linearity
score ("Your Transformer is Secretly Linear", Razzhigaev et al. 2024; ≈ 0.99 reported for
decoders), its centred variant on the update h_{l+1} − h_l, and the per-token nonlinearity
‖(X̃A − Ỹ)_i‖ (LLM-Microscope), aggregated by token type and by token class (punctuation,
determiners, other stop words, numbers, content words; :mod:`geometry.token_classes`).
Definitions and scaling: :mod:`geometry.linearity`.

``layers`` in the result are the *source* layers: entry l describes the transition l → l+1.
Result metrics: ``linearity``, ``linearity_centered``, ``nonlinearity_mean`` and
``nonlinearity__<class>`` for each class present. Arrays: ``nonlinearity`` [transition, token] with
``token_index`` (row in the store), ``token``, ``token_id``, ``doc``, ``window``, ``pos`` and
``token_class`` per token, so the explorer can colour text.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

import geometry
from lens.errors import LensInputError
from studies.common import StudyConfig, prepare
from studies.geometry_support import finite_or_none, layer_states, token_mask
from studies.results import write_result

log = logging.getLogger(__name__)

STUDY = "linearity"


@dataclass(frozen=True)
class Config(StudyConfig):
    """``ridge``: ridge penalty of the map on the normalised matrices (0 = plain least squares, which
    needs more tokens than d_model); ``min_token_count``: occurrences a token type needs to be ranked
    by mean nonlinearity; ``top_tokens``: how many of the most nonlinear token types to report;
    ``drop_special`` / ``min_pos``: leave out special tokens / window positions below ``min_pos``
    (the first position's massive activations would otherwise dominate the normalised fit)."""

    ridge: float = 0.0
    min_token_count: int = 5
    top_tokens: int = 20
    drop_special: bool = True
    min_pos: int = 1

    def __post_init__(self):
        if not self.ridge >= 0:  # also refuses NaN; geometry would raise a bare ValueError mid-run
            raise LensInputError(f"linearity: ridge must be >= 0 (0 = least squares), got {self.ridge}")


def figures(layers, prof, by_class, top_keys, top_vals, model: str) -> dict:
    x = list(layers)
    main = go.Figure()
    main.add_trace(go.Scatter(x=x, y=prof.linearity, mode="lines+markers", name="linearity"))
    main.add_trace(go.Scatter(x=x, y=prof.linearity_centered, mode="lines+markers", name="linearity (centred)"))
    main.add_trace(go.Scatter(x=x, y=prof.nonlinearity_mean, mode="lines+markers", name="mean per-token nonlinearity",
                              yaxis="y2", line=dict(dash="dot")))
    main.update_layout(title=f"Linearity of layer l → l+1 — {model}", xaxis_title="source layer l",
                       yaxis=dict(title="linearity score"),
                       yaxis2=dict(title="per-token nonlinearity", overlaying="y", side="right"),
                       template="plotly_white", hovermode="x unified")
    cls = go.Figure()
    for j, key in enumerate(by_class.keys):
        cls.add_trace(go.Scatter(x=x, y=by_class.mean[:, j], mode="lines+markers",
                                 name=f"{key} (n={by_class.count[j]})"))
    cls.update_layout(title=f"Per-token nonlinearity by token class — {model}", xaxis_title="source layer l",
                      yaxis_title="mean nonlinearity", template="plotly_white")
    tok = go.Figure(go.Bar(x=list(top_vals)[::-1], y=[repr(k) for k in top_keys][::-1], orientation="h"))
    tok.update_layout(title=f"Most nonlinear token types (mean over tokens and layers) — {model}",
                      xaxis_title="mean nonlinearity", template="plotly_white", height=max(400, 22 * len(top_keys)))
    return {"main": main, "by-class": cls, "tokens": tok}


def run(config: Config, out_dir) -> Path:
    """Capture (or reuse) ``resid_post`` states, compute linearity per transition, write the results folder."""
    t0 = time.time()
    _, store = prepare(config, sites=["resid_post"])
    mask = token_mask(store, config.drop_special, config.min_pos)
    layers, mats = layer_states(store, "resid_post", mask)
    n, d = mats[0].shape
    if len(layers) < 2:
        raise LensInputError(f"linearity needs at least 2 layers of resid_post; the store has {layers}")
    if config.ridge == 0 and n - 1 <= d:
        raise LensInputError(
            f"linearity needs more tokens than d_model for a non-trivial least-squares map: got {n} tokens, "
            f"d_model {d}; raise --max-tokens or pass --param ridge=0.01")
    prof = geometry.linearity_profile(mats, layers=layers, ridge=config.ridge)
    src = prof.source_layers.tolist()
    texts = np.asarray(store.tokens["token"])[mask]
    classes = geometry.token_classes(texts)
    by_class = geometry.aggregate_by_class(prof.nonlinearity, texts)
    by_tok = geometry.aggregate_by_token(prof.nonlinearity, texts, min_count=config.min_token_count)
    overall = by_tok.mean.mean(axis=0) if by_tok.keys.size else np.zeros(0)
    order = np.argsort(-overall, kind="stable")[: config.top_tokens]
    top_keys, top_vals = by_tok.keys[order], overall[order]

    metrics = {"linearity": finite_or_none(prof.linearity),
               "linearity_centered": finite_or_none(prof.linearity_centered),
               "nonlinearity_mean": finite_or_none(prof.nonlinearity_mean)}
    for j, key in enumerate(by_class.keys):
        metrics[f"nonlinearity__{key}"] = finite_or_none(by_class.mean[:, j])
    class_mean = {str(k): float(by_class.mean[:, j].mean()) for j, k in enumerate(by_class.keys)}
    summary = {
        "linearity_mean": float(np.mean(prof.linearity)), "linearity_min": float(np.min(prof.linearity)),
        "linearity_min_layer": int(src[int(np.argmin(prof.linearity))]),
        "linearity_centered_mean": float(np.mean(prof.linearity_centered)),
        "class_nonlinearity": class_mean,
        "class_counts": {str(k): int(c) for k, c in zip(by_class.keys, by_class.count)},
        "most_nonlinear_class": max(class_mean, key=class_mean.get) if class_mean else None,
        "top_nonlinear_tokens": [str(k) for k in top_keys],
    }
    tok = store.tokens
    arrays = {
        "layers": np.asarray(src), "nonlinearity": prof.nonlinearity.astype(np.float32),
        "token_index": np.nonzero(mask)[0], "token": texts.astype(str), "token_class": classes,
        "token_id": np.asarray(tok["token_id"])[mask], "doc": np.asarray(tok["doc"])[mask],
        "window": np.asarray(tok["window"])[mask], "pos": np.asarray(tok["pos"])[mask],
        "class_keys": by_class.keys.astype(str), "class_mean": by_class.mean, "class_count": by_class.count,
        "token_type_keys": by_tok.keys.astype(str), "token_type_mean": by_tok.mean, "token_type_count": by_tok.count,
    }
    return write_result(
        out_dir, study=STUDY, model=config.model, corpus=config.corpus, n_tokens=n, config=config,
        layers=src, metrics=metrics, summary=summary, arrays=arrays,
        figures=figures(src, prof, by_class, top_keys, top_vals, config.model), wall_time_s=time.time() - t0,
        extra={"site": "resid_post", "layer_meaning": "transition l -> l+1 of resid_post",
               "nonlinearity_scale": "sqrt(n) * row norm of the residual on normalised matrices; "
                                     "mean square = 1 - linearity"},
    )
