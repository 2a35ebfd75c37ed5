"""Study: context memory by token class (LLM-Microscope, Razzhigaev et al. 2025).

At each layer a ridge probe reads the input embeddings of the previous ``k`` tokens (the store's
``embed`` site) back from a token's state (``probes.ContextMemoryProbe``); per-token held-out scores
are averaged by token class (:mod:`lens.text.token_classes`: punctuation, determiner, stopword, number,
content, other). Seed claim: filler tokens — determiners, punctuation, other stop words — carry the
most context. Beside it, the Spearman correlation between a token's context-memory score at layer l
and its nonlinearity from layer l to l+1 (``geometry.token_nonlinearity``, LLM-Microscope's
‖A h_l − h_{l+1}‖ with the least-squares map A fitted on all probe tokens).

Baseline: the same probe on each token's own input embedding says how much of the prefix the token's
identity alone predicts (digits follow digits; "States" follows "United"); the ``_gain`` keys
subtract it, so a class ranks high there only for what the layers add. Every state passes a fresh
final norm first (``norm``; "auto" = the model card's final-norm kind, ``norm_source`` says which).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from lens.errors import LensInputError
from lens.text.token_classes import token_classes
from studies import sample_size
from studies.config import SiteConfig, resolve_norm
from studies.contract import Inputs, Needs, Study, StudyResult
from studies.sampling import sample_split_units, window_ids
from studies.declarations.context_memory import A, CLAIMS, HEADLINES, M, RESULT, S

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config(SiteConfig):
    """``k``: previous tokens read back; ``max_probe_tokens``: whole documents/windows sampled up to this
    many tokens; ``norm``: fresh final norm before the probe ("auto": the model's own final-norm kind,
    from its card; "rms", "layer", "none"); ``nonlinearity``: also correlate with per-token nonlinearity;
    ``fit_size``: "mark" or "refuse" an underdetermined fit (:mod:`studies.sample_size`)."""

    k: int = 3
    max_probe_tokens: int = 4000
    norm: str = "auto"
    nonlinearity: bool = True
    split_by: str = "auto"
    min_docs: int = 10
    fit_size: str = "mark"


def check(config: Config) -> None:
    sample_size.check_action("context-memory", config.fit_size)
    if config.k < 1:
        raise LensInputError(f"k: expected a positive number of previous tokens, got {config.k}")


def needs(config: Config) -> Needs:
    return Needs(sites=("embed", config.site))


def _nonlinearity_corr(view, test_rows, token_scores, d_model: int):
    """Per layer l < L−1: Spearman ρ between context-memory score and nonlinearity l → l+1."""
    from scipy.stats import spearmanr

    from geometry.linearity import nonlinearity_profile

    n = view.n_tokens
    if n - 1 <= d_model:
        log.warning("nonlinearity needs more tokens (%d) than d_model (%d); skipped", n, d_model)
        return None
    out = [None] * len(view)
    # every layer read and normalised once (it is the target of one transition and the source of the next)
    nl_all = nonlinearity_profile(view.astype(torch.float64))[:, test_rows]
    for i, nl in enumerate(nl_all):
        s = token_scores[i]
        ok = np.isfinite(s) & np.isfinite(nl)
        if ok.sum() >= 3:
            out[i] = float(spearmanr(s[ok], nl[ok]).statistic)
    return out


def compute(config: Config, inputs: Inputs) -> StudyResult:
    from probes.context_memory import ContextMemoryProbe, aggregate_by_class

    store = inputs.store
    norm, norm_source = resolve_norm(config.norm, inputs.card)
    toks = store.tokens
    rows, units, unit_kind = sample_split_units(toks, store.mask(), config.split_by, config.min_docs,
                                                config.max_probe_tokens, config.seed)
    view = store.view(config.site).take(rows)
    targets = store.get(site="embed", rows=rows)  # only the sampled rows are read
    # split by ``units`` (documents or windows); a predecessor must be in the same capture window (the
    # model saw it), so positions jump between windows (window · 2^32 + position) and never look contiguous
    positions = window_ids(toks).astype(np.int64) * (1 << 32) + np.asarray(toks["pos"], dtype=np.int64)
    try:
        r = ContextMemoryProbe(k=config.k, norm=norm, seed=config.seed, layers=view.layers,
                               progress=config.progress).fit(view, targets, units[rows], positions[rows]).result_
        # baseline: the same probe on the token's own input embedding — how much of the prefix its
        # identity alone predicts (after "States" comes "United"); memory is what layers add to it
        base = ContextMemoryProbe(k=config.k, norm=norm, seed=config.seed, layers=["embed"]).fit(
            [targets], targets, units[rows], positions[rows]).result_
    except ValueError as exc:
        raise LensInputError(f"{exc} ({len(rows)} probe tokens in {len(np.unique(units[rows]))} {unit_kind}s; raise "
                             f"--max-tokens, or --param max_probe_tokens above {config.max_probe_tokens})") from None
    size = sample_size.check_fit_size("context-memory", "the ridge maps to the previous tokens' embeddings",
                                      len(rows) - len(r.test_rows), store.d_model, config.fit_size)
    classes = token_classes(np.asarray(toks["token"])[rows][r.test_rows])
    names, by_class = aggregate_by_class(r.token_scores, classes)
    _, base_by_class = aggregate_by_class(base.token_scores, classes)
    metrics = {M.all: r.score, M.all_gain: r.score - base.score[0]}
    for c, name in enumerate(names):
        metrics[str(name)] = by_class[:, c]
    gain = by_class - base_by_class                          # (layer, class)
    order = np.argsort(-np.nanmean(by_class, axis=0))
    gain_order = np.argsort(-np.nanmean(gain, axis=0))
    summary = {S.k: config.k, S.top_class: str(names[order[0]]),
               S.class_ranking: [str(names[i]) for i in order],
               S.top_class_gain: str(names[gain_order[0]]),
               S.class_ranking_gain: [str(names[i]) for i in gain_order],
               S.embed_baseline: {str(n): float(base_by_class[0, c]) for c, n in enumerate(names)},
               S.embed_baseline_all: float(base.score[0]),
               S.class_counts: {str(n): int((classes == n).sum()) for n in names},
               S.n_probe_tokens: int(len(rows)), S.n_test_tokens: int(len(r.test_rows)),
               S.split_unit: unit_kind, S.norm: str(norm), S.norm_source: norm_source,
               S.corr_with_nonlinearity: None, **size.summary()}
    if config.nonlinearity:
        corr = _nonlinearity_corr(view, r.test_rows, r.token_scores, store.d_model)
        if corr is not None:
            metrics[M.corr_nonlinearity] = corr
            vals = [c for c in corr if c is not None]
            summary[S.corr_with_nonlinearity] = float(np.mean(vals)) if vals else None
    arrays = {A.layers: np.asarray(view.layers), A.token_scores: r.token_scores, A.test_rows: rows[r.test_rows],
              A.token_class: classes.astype(str), A.score_by_offset: r.score_by_offset,
              A.classes: np.asarray(names, dtype=str), A.by_class: by_class,
              A.embed_token_scores: base.token_scores[0], A.gain_by_class: gain}
    return StudyResult(model=store.model_id, corpus=inputs.corpus, n_tokens=len(rows), layers=list(view.layers),
                       metrics=metrics, summary=summary, arrays=arrays)


def figures(result: StudyResult, config: Config) -> dict:
    import plotly.graph_objects as go

    a, x = result.arrays, result.layers
    fig = go.Figure()
    for c, name in enumerate(a[A.classes]):
        fig.add_trace(go.Scatter(x=x, y=a[A.by_class][:, c], mode="markers+lines", name=str(name)))
    fig.add_trace(go.Scatter(x=x, y=result.metrics[M.all], mode="lines", name="all tokens",
                             line=dict(dash="dash", color="black")))
    fig.update_layout(title=f"Context memory by token class — {result.model}, k={config.k}, {result.n_tokens} tokens",
                      xaxis_title="layer", yaxis_title="context memory (held-out R² of previous tokens' embeddings)",
                      template="plotly_white")
    return {"main": fig}


STUDY = Study(
    cost=14,
    needs_all_positions="it predicts each token's predecessors in its window",
    config=Config, check=check, needs=needs, compute=compute, figures=figures,
    result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
