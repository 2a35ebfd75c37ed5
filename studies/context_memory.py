"""Study: context memory by token class (LLM-Microscope, Razzhigaev et al. 2025).

At each layer a ridge probe reads the input embeddings of the previous ``k`` tokens (the store's
``embed`` site) back from a token's state (``probes.ContextMemoryProbe``); per-token held-out scores
are averaged by token class (``lens.token_classes``: punctuation, determiner, stopword, number,
content, other). Seed claim: filler tokens — determiners, punctuation, other stop words — carry the
most context. Beside it, the Spearman correlation between a token's context-memory score at layer l
and its nonlinearity from layer l to l+1 (``geometry.token_nonlinearity``, LLM-Microscope's
‖A h_l − h_{l+1}‖ with the least-squares map A fitted on all probe tokens).

Result keys: metrics ``all`` and one per token class (``punctuation``, ``determiner``, ``stopword``,
``number``, ``content``, ``other`` — those present), ``all_gain`` (over the embedding baseline),
``corr_nonlinearity`` (None at the last layer); summary ``corr_with_nonlinearity`` (mean over layers),
``top_class``, ``class_ranking``, ``top_class_gain``, ``class_ranking_gain``, ``embed_baseline``, ``k``.

Baseline: the same probe on each token's own input embedding says how much of the prefix the token's
identity alone predicts (digits follow digits; "States" follows "United"); the ``_gain`` keys
subtract it, so a class ranks high there only for what the layers add.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lens.errors import LensInputError
from lens.token_classes import token_classes
from probes.context_memory import ContextMemoryProbe, aggregate_by_class
from studies.common import StudyConfig, prepare
from studies.prediction_gains import _LayerView, resolve_norm, split_units
from studies.probes_study import _Rows, sample_rows
from studies.results import write_result

log = logging.getLogger(__name__)

STUDY = "context-memory"


@dataclass(frozen=True)
class Config(StudyConfig):
    """``k``: previous tokens read back; ``max_probe_tokens``: whole documents/windows sampled up to this
    many tokens; ``norm``: fresh final norm before the probe ("auto": RMSNorm for Llama-style models,
    LayerNorm otherwise; "none"); ``nonlinearity``: also correlate with per-token nonlinearity."""

    site: str = "resid_post"
    k: int = 3
    max_probe_tokens: int = 4000
    norm: str = "auto"
    nonlinearity: bool = True
    split_by: str = "auto"
    min_docs: int = 10


def _nonlinearity_corr(view, layer_ids, test_rows, token_scores):
    """Per layer l < L−1: Spearman ρ between context-memory score and nonlinearity l → l+1."""
    from scipy.stats import spearmanr

    try:
        from geometry import token_nonlinearity
    except ImportError:
        log.warning("geometry.token_nonlinearity is not available; skipping the nonlinearity correlation")
        return None
    out = [None] * len(layer_ids)
    nxt = view[0].to(torch.float64)
    for i in range(len(layer_ids) - 1):
        cur, nxt = nxt, view[i + 1].to(torch.float64)
        if cur.shape[0] <= cur.shape[1]:
            log.warning("nonlinearity needs more tokens (%d) than d_model (%d); skipped", cur.shape[0], cur.shape[1])
            return None
        nl = np.asarray(token_nonlinearity(cur, nxt))[test_rows]
        s = token_scores[i]
        ok = np.isfinite(s) & np.isfinite(nl)
        if ok.sum() >= 3:
            out[i] = float(spearmanr(s[ok], nl[ok]).statistic)
    return out


def figure(layer_ids, names, by_class, overall, title):
    import plotly.graph_objects as go

    fig = go.Figure()
    for c, name in enumerate(names):
        fig.add_trace(go.Scatter(x=layer_ids, y=by_class[:, c], mode="markers+lines", name=str(name)))
    fig.add_trace(go.Scatter(x=layer_ids, y=overall, mode="lines", name="all tokens", line=dict(dash="dash",
                                                                                                  color="black")))
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="context memory (held-out R² of previous "
                      "tokens' embeddings)", template="plotly_white")
    return fig


def run(config: Config, out_dir) -> Path:
    t0 = time.time()
    if config.k < 1:
        raise LensInputError(f"k: expected a positive number of previous tokens, got {config.k}")
    _, store = prepare(config, sites=["embed", config.site], need_model=False)
    family = store.manifest.get("model", {}).get("family", "llama")
    norm = resolve_norm(config.norm, family)
    layer_ids = list(store.layers(config.site))
    toks = store.tokens
    units, unit_kind = split_units(toks, config.split_by, config.min_docs)
    # predecessors must sit in the same capture window (the model saw them): key rows by window
    windows = np.unique(np.stack([np.asarray(toks["doc"]), np.asarray(toks["window"])], 1), axis=0,
                        return_inverse=True)[1].reshape(-1)
    keep = ~np.asarray(toks["special"], dtype=bool)
    rows = sample_rows(units, keep, config.max_probe_tokens, config.seed)
    view = _Rows(_LayerView(store, config.site, layer_ids), rows)
    targets = store.get(site="embed")[torch.as_tensor(rows)]
    # split by ``units`` (documents or windows); a predecessor must be in the same window, so
    # positions jump between windows (window · 2^32 + position) and never look contiguous
    positions = windows.astype(np.int64) * (1 << 32) + np.asarray(toks["pos"], dtype=np.int64)
    try:
        est = ContextMemoryProbe(k=config.k, norm=norm, seed=config.seed, layers=layer_ids,
                                 progress=config.progress)
        r = est.fit(view, targets, units[rows], positions[rows]).result_
        # baseline: the same probe on the token's own input embedding — how much of the prefix its
        # identity alone predicts (after "States" comes "United"); memory is what layers add to it
        base = ContextMemoryProbe(k=config.k, norm=norm, seed=config.seed, layers=["embed"]).fit(
            [targets], targets, units[rows], positions[rows]).result_
    except ValueError as exc:
        raise LensInputError(f"{STUDY}: {exc} ({len(rows)} probe tokens; raise --max-tokens)") from None
    tokens = np.asarray(toks["token"])[rows][r.test_rows]
    classes = token_classes(tokens)
    names, by_class = aggregate_by_class(r.token_scores, classes)
    _, base_by_class = aggregate_by_class(base.token_scores, classes)
    metrics = {"all": r.score, "all_gain": r.score - base.score[0]}
    for c, name in enumerate(names):
        metrics[str(name)] = by_class[:, c]
    gain = by_class - base_by_class                          # (layer, class)
    mean_by_class = np.nanmean(by_class, axis=0)
    order = np.argsort(-mean_by_class)
    gain_order = np.argsort(-np.nanmean(gain, axis=0))
    summary = {"k": config.k, "top_class": str(names[order[0]]),
               "class_ranking": [str(names[i]) for i in order],
               "top_class_gain": str(names[gain_order[0]]),
               "class_ranking_gain": [str(names[i]) for i in gain_order],
               "embed_baseline": {str(n): float(base_by_class[0, c]) for c, n in enumerate(names)},
               "embed_baseline_all": float(base.score[0]),
               "class_counts": {str(n): int((classes == n).sum()) for n in names},
               "n_probe_tokens": int(len(rows)), "n_test_tokens": int(len(r.test_rows)),
               "split_unit": unit_kind, "norm": str(norm), "corr_with_nonlinearity": None}
    if config.nonlinearity:
        corr = _nonlinearity_corr(view, layer_ids, r.test_rows, r.token_scores)
        if corr is not None:
            metrics["corr_nonlinearity"] = corr
            vals = [c for c in corr if c is not None]
            summary["corr_with_nonlinearity"] = float(np.mean(vals)) if vals else None
    arrays = {"layers": np.asarray(layer_ids), "token_scores": r.token_scores, "test_rows": rows[r.test_rows],
              "token_class": classes.astype(str), "score_by_offset": r.score_by_offset,
              "classes": np.asarray(names, dtype=str), "by_class": by_class,
              "embed_token_scores": base.token_scores[0], "gain_by_class": gain}
    title = f"Context memory by token class — {store.model_id}, k={config.k}, {len(rows)} tokens"
    corpus = store.manifest.get("corpus", {}).get("name", config.corpus)
    return write_result(out_dir, study=STUDY, model=store.model_id, corpus=corpus, n_tokens=len(rows),
                        config=config, layers=layer_ids, metrics=metrics, summary=summary, arrays=arrays,
                        figures={"main": figure(layer_ids, names, by_class, r.score, title)},
                        wall_time_s=time.time() - t0)
