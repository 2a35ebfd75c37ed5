"""Study: character probe per layer with a control task (Hewitt & Liang 2019), plus an ELMo scalar mix.

Label: does the token's text contain ``letter``? A token's spelling is not in its id's embedding
in any obvious way, yet models answer spelling questions; the probe asks at which layers it can be
read linearly. The control task gives each token type a random label with the same base rate;
selectivity = accuracy − control accuracy says how much of the accuracy is more than memorising
token identity. Folds are grouped by document (or capture window when there are few documents).

Result keys: metrics ``accuracy``, ``selectivity``, ``control_accuracy``, ``accuracy_std``,
``mix_weight``; summary ``best_layer``, ``best_accuracy``, ``best_selectivity_layer``, ``majority``,
``positive_share``, ``mix_accuracy``, ``letter``, ``n_probe_tokens``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lens.errors import LensInputError
from probes.linear_probe import LinearProbe, char_labels
from probes.scalar_mix import ScalarMixProbe
from studies.common import StudyConfig, prepare
from studies.prediction_gains import _LayerView, split_units
from studies.results import write_result

STUDY = "probes"


@dataclass(frozen=True)
class Config(StudyConfig):
    """``letter``: the character probed; ``kind``: "ridge" (fast, default) or "logistic";
    ``max_probe_tokens``: tokens sampled (whole documents/windows kept together) for the probes;
    ``scalar_mix``: also fit the ELMo-style mix over layers."""

    site: str = "resid_post"
    letter: str = "e"
    kind: str = "ridge"
    n_folds: int = 5
    max_probe_tokens: int = 4000
    scalar_mix: bool = True
    split_by: str = "auto"
    min_docs: int = 10


def sample_rows(units: np.ndarray, keep: np.ndarray, max_rows: int, seed: int) -> np.ndarray:
    """Rows of whole units (documents or windows), shuffled by unit, up to ``max_rows``."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(np.unique(units[keep]))
    chosen, total = [], 0
    counts = np.bincount(units[keep])
    for u in order:
        if total >= max_rows:
            break
        chosen.append(u)
        total += counts[u]
    return np.flatnonzero(keep & np.isin(units, chosen))


class _Rows:
    """Row subset of a lazy layer view."""

    def __init__(self, view, rows):
        self.view, self.rows = view, rows

    def __len__(self):
        return len(self.view)

    def __getitem__(self, i):
        import torch

        return self.view[i][torch.as_tensor(self.rows)]


def figure(layers, r, title):
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_trace(go.Scatter(x=layers, y=r.accuracy, mode="markers+lines", name="accuracy (real task)",
                             error_y=dict(type="data", array=r.accuracy_std)))
    fig.add_trace(go.Scatter(x=layers, y=r.control_accuracy, mode="markers+lines", name="control task"))
    fig.add_trace(go.Scatter(x=layers, y=r.selectivity, mode="markers+lines", name="selectivity"))
    fig.add_hline(y=r.majority, line_dash="dot", annotation_text="majority label")
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="cross-validated accuracy",
                      template="plotly_white")
    return fig


def run(config: Config, out_dir) -> Path:
    t0 = time.time()
    if not isinstance(config.letter, str) or len(config.letter) != 1:
        raise LensInputError(f"letter: expected a single character, got {config.letter!r}")
    _, store = prepare(config, sites=[config.site], need_model=False)
    layer_ids = list(store.layers(config.site))
    toks = store.tokens
    units, unit_kind = split_units(toks, config.split_by, config.min_docs)
    keep = ~np.asarray(toks["special"], dtype=bool)
    rows = sample_rows(units, keep, config.max_probe_tokens, config.seed)
    labels = char_labels(list(np.asarray(toks["token"])[rows]), config.letter)
    if labels.all() or not labels.any():
        raise LensInputError(f"letter {config.letter!r}: expected tokens with and without it among the "
                             f"{len(rows)} probe tokens, got {'all' if labels.all() else 'none'} with it")
    X = _Rows(_LayerView(store, config.site, layer_ids), rows)
    n_units = len(np.unique(units[rows]))
    n_folds = min(config.n_folds, n_units)       # few documents (a short run): one fold per unit
    try:
        r = LinearProbe(kind=config.kind, n_folds=max(n_folds, 2), seed=config.seed, layers=layer_ids,
                        progress=config.progress).fit(X, labels, word_types=np.asarray(toks["token_id"])[rows],
                                                      groups=units[rows]).result_
    except ValueError as exc:
        raise LensInputError(f"{STUDY}: {exc} ({len(rows)} probe tokens in {len(np.unique(units[rows]))} "
                             f"{unit_kind}s; raise --max-tokens)") from None
    metrics = {"accuracy": r.accuracy, "selectivity": r.selectivity, "control_accuracy": r.control_accuracy,
               "accuracy_std": r.accuracy_std}
    sel_best = int(np.nanargmax(r.selectivity))
    summary = {"best_layer": r.best_layer, "best_accuracy": float(np.nanmax(r.accuracy)),
               "best_selectivity_layer": int(layer_ids[sel_best]),
               "best_selectivity": float(r.selectivity[sel_best]), "majority": r.majority,
               "positive_share": float(labels.mean()), "letter": config.letter, "kind": config.kind,
               "n_probe_tokens": int(len(rows)), "split_unit": unit_kind, "n_folds": n_folds}
    arrays = {"layers": np.asarray(layer_ids), "rows": rows, "labels": labels}
    if config.scalar_mix:
        try:
            mix = ScalarMixProbe(seed=config.seed, layers=layer_ids).fit(X, labels, groups=units[rows]).result_
            metrics["mix_weight"] = mix.weights
            summary["mix_accuracy"] = mix.accuracy
            summary["mix_gamma"] = mix.gamma
        except ValueError as exc:
            raise LensInputError(f"{STUDY} scalar mix: {exc}") from None
    title = (f"Character probe (token contains {config.letter!r}) — {store.model_id}, "
             f"{len(rows)} tokens, {config.kind}")
    corpus = store.manifest.get("corpus", {}).get("name", config.corpus)
    return write_result(out_dir, study=STUDY, model=store.model_id, corpus=corpus, n_tokens=len(rows),
                        config=config, layers=layer_ids, metrics=metrics, summary=summary, arrays=arrays,
                        figures={"main": figure(layer_ids, r, title)}, wall_time_s=time.time() - t0)
