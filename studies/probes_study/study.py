"""Study: character probe per layer with a control task (Hewitt & Liang 2019), plus an ELMo scalar mix.

Label: does the token's text contain ``letter``? A token's spelling is not in its id's embedding
in any obvious way, yet models answer spelling questions; the probe asks at which layers it can be
read linearly. The control task gives each token type a random label with the same base rate;
selectivity = accuracy − control accuracy says how much of the accuracy is more than memorising
token identity. Folds are grouped by document (or capture window when there are few documents).
Both tasks use one probe configuration, the regularisation strength the real task chose in each fold
(``control_strength="shared"``, as Hewitt & Liang compare them); ``"per_task"`` is the named variant
where the control task chooses its own.

The control task is drawn ``control_draws`` times (seeds seed, seed + 1, ...) and its accuracy averaged: on
SmolLM2 (4000 wiki-sample tokens) one draw's random labels for the few most frequent token types moved the
mean selectivity between 0.04 and 0.09, more than the document bootstrap's whole interval (0.03 wide).

The judged claim reads ``mean_selectivity``: selectivity averaged over layers, from the out-of-fold
predictions (every probe token is held out once per layer), with a 95% interval that resamples whole split
units (documents, or windows when there are few), widened by the spread of the control draws
(:func:`widen`), and its value refitted on nested subsamples of those units (:mod:`studies.core.stability`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from lens.errors import LensInputError
from studies.core import stability
from studies.core.config import SiteConfig
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.core.sampling import sample_split_units
from studies.core.stats import bootstrap_group_means
from studies.probes_study.declaration import A, CLAIMS, HEADLINES, M, RESULT, S
from probes.linear_probe import CONTROL_STRENGTHS, LinearProbe, char_labels
from probes.scalar_mix import ScalarMixProbe


@dataclass(frozen=True)
class Config(SiteConfig):
    """``letter``: the character probed; ``kind``: "ridge" (fast, default) or "logistic";
    ``sample_tokens``: tokens sampled (whole documents/windows kept together) for the probes;
    ``scalar_mix``: also fit the ELMo-style mix over layers; ``control_strength``: "shared" (the control
    task is fitted with the strength the real task chose, one probe configuration) or "per_task";
    ``control_draws``: control tasks drawn (their accuracy averaged);
    ``n_boot``: unit-bootstrap resamples of the selectivity intervals; ``nested``: refit the probes on nested
    quarter and half subsamples of the units for the judged value's stability (:mod:`studies.core.stability`)."""

    letter: str = "e"
    kind: str = "ridge"
    n_folds: int = 5
    sample_tokens: int = 4000
    scalar_mix: bool = True
    split_by: str = "auto"
    min_docs: int = 10
    control_strength: str = "shared"
    control_draws: int = 5
    n_boot: int = 1000
    nested: bool = True


def check(config: Config) -> None:
    if config.control_strength not in CONTROL_STRENGTHS:
        raise LensInputError(f"control_strength: expected one of {CONTROL_STRENGTHS}, got {config.control_strength!r}")
    if not isinstance(config.control_draws, int) or config.control_draws < 1:
        raise LensInputError(f"control_draws: expected a positive integer, got {config.control_draws!r}")
    if not isinstance(config.letter, str) or len(config.letter) != 1:
        raise LensInputError(f"letter: expected a single character, got {config.letter!r}")


def needs(config: Config) -> Needs:
    return Needs(sites=(config.site,))


def compute(config: Config, inputs: Inputs) -> StudyResult:
    store = inputs.store
    toks = store.tokens
    rows, units, unit_kind = sample_split_units(toks, store.mask(), config.split_by, config.min_docs,
                                                config.sample_tokens, config.seed)
    labels = char_labels(list(np.asarray(toks["token"])[rows]), config.letter)
    if labels.all() or not labels.any():
        raise LensInputError(f"letter {config.letter!r}: expected tokens with and without it among the "
                             f"{len(rows)} probe tokens, got {'all' if labels.all() else 'none'} with it")
    X = store.view(config.site).take(rows)
    layer_ids = X.layers
    n_units = len(np.unique(units[rows]))
    n_folds = min(config.n_folds, n_units)       # few documents (a short run): one fold per unit
    try:
        r = LinearProbe(kind=config.kind, n_folds=max(n_folds, 2), seed=config.seed, layers=layer_ids,
                        progress=config.progress, control_strength=config.control_strength,
                        n_control_draws=config.control_draws).fit(X, labels, word_types=np.asarray(toks["token_id"])[rows],
                                                      groups=units[rows]).result_
    except ValueError as exc:
        raise LensInputError(f"{exc} ({len(rows)} probe tokens in {n_units} {unit_kind}s; raise --max-tokens, "
                             f"or --param sample_tokens above {config.sample_tokens})") from None
    metrics = {M.accuracy: r.accuracy, M.selectivity: r.selectivity, M.control_accuracy: r.control_accuracy,
               M.accuracy_std: r.accuracy_std}
    sel_best = int(np.nanargmax(r.selectivity))
    summary = {S.best_layer: r.best_layer, S.best_accuracy: float(np.nanmax(r.accuracy)),
               S.best_selectivity_layer: int(layer_ids[sel_best]),
               S.best_selectivity: float(r.selectivity[sel_best]), S.majority: r.majority,
               S.positive_share: float(labels.mean()), S.letter: config.letter, S.kind: config.kind,
               S.n_probe_tokens: int(len(rows)), S.split_unit: unit_kind, S.n_folds: n_folds,
               S.control_strength: config.control_strength,
               **_judged(config, store, r, rows, units[rows], labels, toks)}
    lo, hi = _per_layer_interval(r, units[rows], config)
    metrics[M.selectivity_low], metrics[M.selectivity_high] = lo, hi
    if config.scalar_mix:
        try:
            mix = ScalarMixProbe(seed=config.seed, layers=layer_ids).fit(X, labels, groups=units[rows]).result_
        except ValueError as exc:
            raise LensInputError(f"scalar mix: {exc}") from None
        metrics[M.mix_weight] = mix.weights
        summary[S.mix_accuracy] = mix.accuracy
        summary[S.mix_gamma] = mix.gamma
    return StudyResult(model=store.model_id, corpus=inputs.corpus, n_tokens=len(rows), layers=list(layer_ids),
                       metrics=metrics, summary=summary,
                       arrays={A.layers: np.asarray(layer_ids), A.rows: rows, A.labels: labels})


def oof_selectivity(r) -> np.ndarray:
    """(layer, token): held-out real-task correctness − control-task correctness of each probe token."""
    if r.correct is None or r.control_correct is None:
        raise ValueError("the probe kept no out-of-fold predictions (a regression, or no control task)")
    return np.asarray(r.correct, np.float64) - np.asarray(r.control_correct, np.float64)


def mean_selectivity(r) -> float:
    """Selectivity averaged over layers, from the out-of-fold predictions (each token held out once per layer)."""
    return float(np.nanmean(oof_selectivity(r)))


def draw_selectivity(r) -> np.ndarray:
    """(draw, layer): the out-of-fold selectivity against each control draw alone."""
    if r.control_draw_accuracy is None:
        raise ValueError("the probe kept no per-draw control accuracy")
    return np.nanmean(np.asarray(r.correct, np.float64), axis=1)[None, :] - np.asarray(r.control_draw_accuracy)


def widen(value, low, high, draws):
    """The unit-bootstrap interval [low, high] of a mean over control draws, each side widened in quadrature by
    1.96 standard errors of that mean over the draws (``draws``: the statistic against each draw, along axis 0;
    unchanged with one draw). The bootstrap keeps the draws fixed, so it misses their spread."""
    draws = np.asarray(draws, np.float64)
    value, low, high = (np.asarray(v, np.float64) for v in (value, low, high))
    if draws.shape[0] < 2:
        return low, high
    z = 1.96 * draws.std(axis=0, ddof=1) / np.sqrt(draws.shape[0])
    return value - np.hypot(value - low, z), value + np.hypot(high - value, z)


def _per_layer_interval(r, units: np.ndarray, config: Config) -> tuple[list, list]:
    """Per layer, the 95% interval of the out-of-fold selectivity with whole units resampled, widened by the
    spread of the control draws."""
    d = oof_selectivity(r)
    codes = np.unique(units, return_inverse=True)[1].reshape(-1)
    G = int(codes.max()) + 1
    ok = ~np.isnan(d)
    sums = np.stack([np.bincount(codes, weights=np.where(o, v, 0.0), minlength=G) for v, o in zip(d, ok)])
    counts = np.stack([np.bincount(codes, weights=o.astype(float), minlength=G) for o in ok])
    lo, hi = bootstrap_group_means(sums, counts, config.n_boot, config.seed)
    lo, hi = widen(sums.sum(1) / counts.sum(1), lo, hi, draw_selectivity(r))
    return [float(v) for v in lo], [float(v) for v in hi]


def _judged(config: Config, store, r, rows: np.ndarray, units: np.ndarray, labels: np.ndarray, toks) -> dict:
    """The judged claim's entries: mean selectivity over layers (out of fold), its unit-bootstrap interval, and
    its value with the probes refitted on nested subsamples of the units (a quarter, a half, all)."""
    d = np.nanmean(oof_selectivity(r), axis=0)              # per token: mean over layers
    codes = np.unique(units, return_inverse=True)[1].reshape(-1)
    sums = np.bincount(codes, weights=d)
    counts = np.bincount(codes).astype(float)
    low, high = bootstrap_group_means(sums, counts, config.n_boot, config.seed)
    value = mean_selectivity(r)
    per_draw = draw_selectivity(r).mean(axis=1)
    low, high = widen(value, low, high, per_draw)
    out = {S.mean_selectivity: value, S.mean_selectivity_low: float(low), S.mean_selectivity_high: float(high),
           S.n_units: int(len(counts)), S.control_draw_selectivity: [round(float(v), 6) for v in per_draw]}
    if not config.nested:
        return out
    word_types = np.asarray(toks["token_id"])[rows]

    def statistic(mask):
        if mask.all():
            return value
        n_sub = len(np.unique(units[mask]))
        if n_sub < 2 or labels[mask].all() or not labels[mask].any():
            raise ValueError("too few units, or one class only, for a cross-validated probe")
        sub = LinearProbe(kind=config.kind, n_folds=min(config.n_folds, n_sub), seed=config.seed,
                          layers=r.layers, control_strength=config.control_strength,
                          n_control_draws=config.control_draws)
        sub.fit(store.view(config.site).take(rows[mask]), labels[mask], word_types=word_types[mask],
                groups=units[mask])
        return mean_selectivity(sub.result_)

    values, sizes = stability.nested_values(statistic, units, config.seed)
    return {**out, **stability.record(S.mean_selectivity, values, sizes)}


def figures(result: StudyResult, config: Config) -> dict:
    m, s, x = result.metrics, result.summary, result.layers
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=m[M.accuracy], mode="markers+lines", name="accuracy (real task)",
                             error_y=dict(type="data", array=m[M.accuracy_std])))
    fig.add_trace(go.Scatter(x=x, y=m[M.control_accuracy], mode="markers+lines", name="control task"))
    band = {}
    if M.selectivity_low in m and M.selectivity_high in m:  # the unit-bootstrap 95% interval (newer results)
        sel = np.asarray(m[M.selectivity], float)
        band = dict(error_y=dict(type="data", symmetric=False,
                                 array=np.maximum(np.asarray(m[M.selectivity_high], float) - sel, 0),
                                 arrayminus=np.maximum(sel - np.asarray(m[M.selectivity_low], float), 0)))
    fig.add_trace(go.Scatter(x=x, y=m[M.selectivity], mode="markers+lines", name="selectivity (95% interval)",
                             **band))
    fig.add_hline(y=s[S.majority], line_dash="dot", annotation_text="majority label")
    fig.update_layout(title=f"Character probe (token contains {s[S.letter]!r}) — {result.model}, "
                            f"{result.n_tokens} tokens, {s[S.kind]}",
                      xaxis_title=RESULT.axis(result).title, yaxis_title="cross-validated accuracy", template="plotly_white")
    return {"main": fig}


STUDY = Study(
    cost=45,
    config=Config, check=check, needs=needs, compute=compute, figures=figures,
    result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
