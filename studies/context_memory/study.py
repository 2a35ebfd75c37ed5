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

The claims are judged on that identity-corrected gain, one number per token as the paper's decoder gives
one per token (it pools every layer): a token's gain is its score averaged over layers minus its baseline.
``filler_margin_gain``: the best filler class's mean gain minus the best other class's (> 0: a filler class
holds the most); ``corr_gain_nonlinearity``: Spearman ρ over held-out tokens between the gain and the
token's nonlinearity averaged over transitions. Both carry a 95% bootstrap interval over the held-out
documents (their windows when fewer than ``min_docs`` documents are held out; the fit held fixed) and
their values when the probes are fitted again on nested subsamples of the units (:mod:`studies.core.stability`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np
import torch
import plotly.graph_objects as go
from scipy.stats import spearmanr

from lens.errors import LensInputError
from lens.text.token_classes import token_classes
from studies.core import stability
from studies.core.config import SiteConfig, resolve_norm
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.core.sampling import sample_split_units, window_ids
from studies.context_memory.declaration import A, CLAIMS, HEADLINES, M, RESULT, S
from geometry.linearity import nonlinearity_profile
from probes.context_memory import ContextMemoryProbe, aggregate_by_class

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config(SiteConfig):
    """``k``: previous tokens read back; ``sample_tokens``: whole documents/windows sampled up to this
    many tokens; ``norm``: fresh final norm before the probe ("auto": the model's own final-norm kind,
    from its card; "rms", "layer", "none"); ``nonlinearity``: also correlate with per-token nonlinearity;
    ``n_boot``: bootstrap replicates over held-out units for the judged values' intervals."""

    k: int = 3
    sample_tokens: int = 4000
    norm: str = "auto"
    nonlinearity: bool = True
    split_by: str = "auto"
    min_docs: int = 10
    n_boot: int = 1000


def check(config: Config) -> None:
    if config.n_boot < 1:
        raise LensInputError(f"n_boot: expected at least 1 bootstrap replicate, got {config.n_boot}")
    if config.k < 1:
        raise LensInputError(f"k: expected a positive number of previous tokens, got {config.k}")


def needs(config: Config) -> Needs:
    return Needs(sites=("embed", config.site))


FILLERS = frozenset({"punctuation", "determiner", "stopword"})


def _nonlinearity(view, d_model: int):
    """Per-token nonlinearity l → l+1 of every probe token, (layer − 1, token); None when the sample is too
    small for the least-squares maps (no more tokens than d_model)."""
    if view.n_tokens - 1 <= d_model:
        log.warning("nonlinearity needs more tokens (%d) than d_model (%d); skipped", view.n_tokens, d_model)
        return None
    # every layer read and normalised once (it is the target of one transition and the source of the next)
    return np.asarray(nonlinearity_profile(view.astype(torch.float64)))


def _layer_corr(nl_test, token_scores):
    """Per layer l < L−1: Spearman ρ between the raw context-memory score at l and nonlinearity l → l+1."""
    out = [None] * len(token_scores)
    for i, nl in enumerate(nl_test):
        s = token_scores[i]
        ok = np.isfinite(s) & np.isfinite(nl)
        if ok.sum() >= 3:
            out[i] = float(spearmanr(s[ok], nl[ok]).statistic)
    return out


def token_gain(token_scores, base_scores):
    """A token's memory over its identity baseline: its score averaged over layers minus the baseline's."""
    with np.errstate(all="ignore"):
        pooled = np.nanmean(np.where(np.isfinite(token_scores), token_scores, np.nan), axis=0)
    return pooled - np.asarray(base_scores, float)


def filler_margin(gain, classes, weights=None):
    """The best filler class's mean gain minus the best other class's (None when either side is absent).
    ``weights`` (token,): how often each token counts (a bootstrap replicate's unit multiplicities)."""
    gain, classes = np.asarray(gain, float), np.asarray(classes)
    w = np.ones(len(gain)) if weights is None else np.asarray(weights, float)
    ok = np.isfinite(gain) & (w > 0)
    best = {True: None, False: None}
    for c in np.unique(classes[ok]):
        m = ok & (classes == c)
        mean = float((gain[m] * w[m]).sum() / w[m].sum())
        side = str(c) in FILLERS
        best[side] = mean if best[side] is None else max(best[side], mean)
    return None if best[True] is None or best[False] is None else best[True] - best[False]


def gain_nonlinearity_corr(gain, nl_pooled):
    """Spearman ρ over tokens between the memory gain and the nonlinearity averaged over transitions."""
    gain, nl_pooled = np.asarray(gain, float), np.asarray(nl_pooled, float)
    ok = np.isfinite(gain) & np.isfinite(nl_pooled)
    if ok.sum() < 3 or np.ptp(gain[ok]) == 0 or np.ptp(nl_pooled[ok]) == 0:
        return None
    return float(spearmanr(gain[ok], nl_pooled[ok]).statistic)


def bootstrap_units(units, n_boot: int, seed: int, *stats):
    """95% percentile intervals of each ``stat(index)`` with the held-out units resampled whole: each replicate
    draws the units with replacement and passes the token indices of the drawn units (repeats included)."""
    codes = np.unique(np.asarray(units), return_inverse=True)[1].reshape(-1)
    members = [np.flatnonzero(codes == u) for u in range(int(codes.max()) + 1)] if codes.size else []
    rng = np.random.default_rng(seed)
    vals = [[] for _ in stats]
    for _ in range(n_boot if len(members) > 1 else 0):
        idx = np.concatenate([members[u] for u in rng.integers(0, len(members), len(members))])
        for k, stat in enumerate(stats):
            v = stat(idx)
            if v is not None and np.isfinite(v):
                vals[k].append(v)
    return [(float(np.quantile(v, 0.025)), float(np.quantile(v, 0.975))) if len(v) >= 10 else (None, None)
            for v in vals]


def _fit_probes(config, norm, store, rows, units, positions):
    """The context-memory probe at every layer and its identity baseline on ``rows`` (store rows)."""
    view = store.view(config.site).take(rows)
    targets = store.get(site="embed", rows=rows)  # only the sampled rows are read
    r = ContextMemoryProbe(k=config.k, norm=norm, seed=config.seed, layers=view.layers,
                           progress=config.progress).fit(view, targets, units[rows], positions[rows]).result_
    # baseline: the same probe on the token's own input embedding — how much of the prefix its
    # identity alone predicts (after "States" comes "United"); memory is what layers add to it
    base = ContextMemoryProbe(k=config.k, norm=norm, seed=config.seed, layers=["embed"]).fit(
        [targets], targets, units[rows], positions[rows]).result_
    return view, r, base


def compute(config: Config, inputs: Inputs) -> StudyResult:
    store = inputs.store
    norm, norm_source = resolve_norm(config.norm, inputs.card)
    toks = store.tokens
    rows, units, unit_kind = sample_split_units(toks, store.mask(), config.split_by, config.min_docs,
                                                config.sample_tokens, config.seed)
    # split by ``units`` (documents or windows); a predecessor must be in the same capture window (the
    # model saw it), so positions jump between windows (window · 2^32 + position) and never look contiguous
    positions = window_ids(toks).astype(np.int64) * (1 << 32) + np.asarray(toks["pos"], dtype=np.int64)
    try:
        view, r, base = _fit_probes(config, norm, store, rows, units, positions)
    except ValueError as exc:
        raise LensInputError(f"{exc} ({len(rows)} probe tokens in {len(np.unique(units[rows]))} {unit_kind}s; raise "
                             f"--max-tokens, or --param sample_tokens above {config.sample_tokens})") from None
    all_classes = token_classes(np.asarray(toks["token"])[rows])
    classes = all_classes[r.test_rows]
    names, by_class = aggregate_by_class(r.token_scores, classes)
    _, base_by_class = aggregate_by_class(base.token_scores, classes)
    metrics = {M.all: r.score, M.all_gain: r.score - base.score[0]}
    for c, name in enumerate(names):
        metrics[str(name)] = by_class[:, c]
    gain = by_class - base_by_class                          # (layer, class)
    order = np.argsort(-np.nanmean(by_class, axis=0))
    gain_order = np.argsort(-np.nanmean(gain, axis=0))
    # the judged values: one identity-corrected memory per held-out token, as the paper's decoder gives one
    g = token_gain(r.token_scores, base.token_scores[0])
    test_units, boot_unit = units[rows][r.test_rows], unit_kind
    if unit_kind == "doc" and len(np.unique(test_units)) < config.min_docs:  # too few held-out documents
        test_units, boot_unit = window_ids(toks)[rows][r.test_rows], "window"
    margin = filler_margin(g, classes)
    nl_all = _nonlinearity(view, store.d_model) if config.nonlinearity else None
    nl_pooled = None if nl_all is None else np.nanmean(nl_all, axis=0)  # per probe token, over transitions
    corr = None if nl_pooled is None else gain_nonlinearity_corr(g, nl_pooled[r.test_rows])
    stats = [lambda idx: filler_margin(g[idx], classes[idx])]
    if corr is not None:
        stats.append(lambda idx: gain_nonlinearity_corr(g[idx], nl_pooled[r.test_rows][idx]))
    intervals = bootstrap_units(test_units, config.n_boot, config.seed, *stats) + [(None, None)]
    summary = {S.k: config.k, S.top_class: str(names[order[0]]),
               S.class_ranking: [str(names[i]) for i in order],
               S.top_class_gain: str(names[gain_order[0]]),
               S.class_ranking_gain: [str(names[i]) for i in gain_order],
               S.embed_baseline: {str(n): float(base_by_class[0, c]) for c, n in enumerate(names)},
               S.embed_baseline_all: float(base.score[0]),
               S.class_counts: {str(n): int((classes == n).sum()) for n in names},
               S.n_probe_tokens: int(len(rows)), S.n_test_tokens: int(len(r.test_rows)),
               S.n_test_units: int(len(np.unique(test_units))), S.boot_unit: boot_unit,
               S.split_unit: unit_kind, S.norm: str(norm), S.norm_source: norm_source,
               S.filler_margin_gain: margin, S.filler_margin_gain_low: intervals[0][0],
               S.filler_margin_gain_high: intervals[0][1],
               S.corr_gain_nonlinearity: corr, S.corr_gain_nonlinearity_low: intervals[1][0],
               S.corr_gain_nonlinearity_high: intervals[1][1], S.corr_with_nonlinearity: None}
    # nested subsamples of the units: both probes fitted again on a quarter and a half of them
    nested = _nested(config, norm, store, rows, units, positions, all_classes, nl_pooled, margin, corr)
    summary.update(stability.record(S.filler_margin_gain, *nested[0]))
    if corr is not None:
        summary.update(stability.record(S.corr_gain_nonlinearity, *nested[1]))
    if nl_all is not None:
        per_layer = _layer_corr(nl_all[:, r.test_rows], r.token_scores)
        metrics[M.corr_nonlinearity] = per_layer
        vals = [c for c in per_layer if c is not None]
        summary[S.corr_with_nonlinearity] = float(np.mean(vals)) if vals else None
    arrays = {A.layers: np.asarray(view.layers), A.token_scores: r.token_scores, A.test_rows: rows[r.test_rows],
              A.token_class: classes.astype(str), A.score_by_offset: r.score_by_offset,
              A.classes: np.asarray(names, dtype=str), A.by_class: by_class,
              A.embed_token_scores: base.token_scores[0], A.gain_by_class: gain, A.token_gain: g}
    return StudyResult(model=store.model_id, corpus=inputs.corpus, n_tokens=len(rows), layers=list(view.layers),
                       metrics=metrics, summary=summary, arrays=arrays)


def _nested(config, norm, store, rows, units, positions, all_classes, nl_pooled, margin, corr):
    """((margins, sizes), (correlations, sizes)) on nested subsamples of the probe rows' units (N/4, N/2, N),
    both probes fitted again on each; the per-token nonlinearity stays the full sample's."""
    margins, corrs, sizes = [], [], []
    for mask in stability.nested_units(units[rows], config.seed):
        sizes.append(int(mask.sum()))
        if mask.all():
            margins.append(margin)
            corrs.append(corr)
            continue
        sub = rows[mask]
        try:
            _, r, base = _fit_probes(dataclasses.replace(config, progress=False), norm, store, sub, units, positions)
        except (ValueError, LensInputError):
            margins.append(None)
            corrs.append(None)
            continue
        g = token_gain(r.token_scores, base.token_scores[0])
        margins.append(filler_margin(g, all_classes[mask][r.test_rows]))
        corrs.append(None if nl_pooled is None else gain_nonlinearity_corr(g, nl_pooled[mask][r.test_rows]))
    return (margins, sizes), (corrs, sizes)


def figures(result: StudyResult, config: Config) -> dict:
    a, x = result.arrays, result.layers
    fig = go.Figure()
    for c, name in enumerate(a[A.classes]):
        fig.add_trace(go.Scatter(x=x, y=a[A.by_class][:, c], mode="markers+lines", name=str(name)))
    fig.add_trace(go.Scatter(x=x, y=result.metrics[M.all], mode="lines", name="all tokens",
                             line=dict(dash="dash", color="black")))
    fig.update_layout(title=f"Context memory by token class — {result.model}, k={config.k}, {result.n_tokens} tokens",
                      xaxis_title=RESULT.axis(result).title, yaxis_title="context memory (held-out R² of previous tokens' embeddings)",
                      template="plotly_white")
    return {"main": fig}


STUDY = Study(
    cost=25,
    needs_all_positions="it predicts each token's predecessors in its window",
    config=Config, check=check, needs=needs, compute=compute, figures=figures,
    result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
