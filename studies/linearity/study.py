"""Study: token linearity between consecutive layers, and per-token nonlinearity by token class.

For every pair of consecutive layers l → l+1 of ``Config.site`` (``resid_post`` unless told; special
tokens left out): the linearity score ("Your Transformer is Secretly Linear", Razzhigaev et al. 2024;
≈ 0.99 reported for decoders), its centred variant on the update h_{l+1} − h_l, and the per-token
nonlinearity ‖(X̃A − Ỹ)_i‖ (LLM-Microscope), aggregated by token type and by token class (punctuation,
determiners, other stop words, numbers, content words; :mod:`lens.text.token_classes`).
Definitions and scaling: :mod:`geometry.linearity`. ``layers`` in the result are the *source*
layers: entry l describes the transition l → l+1.

Tokens: every token of each window by default, special tokens (a BOS) and position 0 included, as the
paper's code scores them; the sink-free score (neither) is reported beside it (``linearity_sink_free``) —
position 0's massive activations weigh heavily on a Frobenius-normalised fit. The judged mean score carries a
document-bootstrap interval (maps held fixed), its refitted values on nested subsamples and a permuted-pairing
null (:func:`judgement`, :mod:`geometry.nulls`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import plotly.graph_objects as go

from lens.errors import LensInputError
from lens.text.token_classes import TOKEN_CLASSES, token_classes
from studies.core.config import TokenFilterConfig
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.core import stability
from studies.core.sampling import sample_mask, split_units
from studies.linearity.declaration import A, CLAIMS, HEADLINES, KEY, M, RESULT, S
from geometry import nulls
import geometry


@dataclass(frozen=True)
class Config(TokenFilterConfig):
    """``ridge``: ridge penalty of the map on the normalised matrices (0 = plain least squares, which
    needs more tokens than d_model); ``min_token_count``: occurrences a token type needs to be ranked
    by mean nonlinearity; ``top_tokens``: how many of the most nonlinear token types to report;
    ``skip_first`` / ``drop_special``: the geometry studies' shared token filter (first positions, special tokens) — by
    default none: the paper scores every token of each window, the BOS its tokenizer adds and position 0
    included (its code: ``tokenizer(text)`` and every hidden state); the sink-free score (no special token,
    no position 0, whose massive activations weigh on the normalised fit) is reported beside it;
    ``null_permutations``: permuted pairings scored for the null (on the weakest transition);
    ``n_boot``: bootstrap replicates over documents (windows when fewer than 10) for the interval;
    ``sample_tokens``: above this many analysed tokens, the maps are fitted on whole windows drawn
    at random (``seed``) up to it — two layers of the sample in memory, not of the store — recorded in
    ``extra["sample"]`` (0 = every token)."""

    ridge: float = 0.0
    min_token_count: int = 5
    top_tokens: int = 20
    skip_first: int = 0  # the paper scores every position (the shared default, 1, is overridden here)
    drop_special: bool = False
    sample_tokens: int = 50_000
    null_permutations: int = 19
    n_boot: int = 1000

    def __post_init__(self):
        super().__post_init__()
        if not self.ridge >= 0:  # also refuses NaN; geometry would raise a bare ValueError mid-run
            raise LensInputError(f"linearity: ridge must be >= 0 (0 = least squares), got {self.ridge}")
        if self.null_permutations < 1 or self.n_boot < 2:
            raise LensInputError(f"linearity: null_permutations must be >= 1 and n_boot >= 2; got "
                                 f"{self.null_permutations}, {self.n_boot}")


def needs(config: Config) -> Needs:
    return Needs(sites=(config.site,))


def most_nonlinear(keys: np.ndarray, mean: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``n`` token types with the largest nonlinearity averaged over transitions, and those values."""
    overall = mean.mean(axis=0) if keys.size else np.zeros(0)
    order = np.argsort(-overall, kind="stable")[:n]
    return keys[order], overall[order]


def judged_subsets(units: np.ndarray, sink_free: np.ndarray, seed: int) -> list[np.ndarray]:
    """The row masks the judgement refits on, in one pass with the profile
    (:func:`geometry.linearity_profile`'s ``subsets``): the nested subsamples N/4 and N/2 of the units
    (:func:`studies.core.stability.nested_units`), then the sink-free rows."""
    inv = np.unique(units, return_inverse=True)[1].reshape(-1)
    return [*stability.nested_units(inv, seed, stability.NESTED_FRACTIONS[:-1]), np.asarray(sink_free, bool)]


def _subset_mean(scores: np.ndarray) -> float | None:
    """The mean score over transitions of a refitted subset; None where it could not be fitted (NaN)."""
    return float(np.mean(scores)) if np.all(np.isfinite(scores)) else None


def large_n(values, sizes) -> float | None:
    """The intercept a of ``score ≈ a + b / n`` fitted through the nested values (None with fewer than two):
    where the in-sample score heads as tokens grow — an in-sample least-squares fit's optimism falls as 1/n."""
    pts = [(1.0 / n, v) for v, n in zip(values, sizes) if v is not None and n]
    if len(pts) < 2:
        return None
    x, y = np.asarray(pts).T
    return float(np.polyfit(x, y, 1)[1])


def judgement(view, prof, units: np.ndarray, sink_free: np.ndarray, config: Config) -> tuple[dict, dict]:
    """The claim's numbers beside the profile on every analysed token: the 95% interval of the mean score
    (documents resampled with each fitted map held fixed: :func:`geometry.nulls.bootstrap_ratio`), its
    value on nested subsamples (refitted), the permuted-pairing null of the weakest transition, and the
    sink-free profile (the rows of ``sink_free`` only). (metrics, summary)."""
    n = view.n_tokens
    uniq, inv = np.unique(units, return_inverse=True)
    summary, metrics = {}, {}
    low = high = None
    if len(uniq) >= 2:
        resid = prof.nonlinearity.astype(np.float64) ** 2 / n  # [pair, token]: r_i² (module geometry.linearity)
        R = np.stack([np.bincount(inv, weights=row, minlength=len(uniq)) for row in resid])
        T = np.stack([np.bincount(inv, weights=row, minlength=len(uniq)) for row in prof.target_sq])
        W = nulls.bootstrap_weights(len(uniq), config.n_boot, config.seed)
        low, high = nulls.percentile_interval(nulls.bootstrap_ratio(R, T, W).mean(axis=1))
    summary[S.linearity_mean_low], summary[S.linearity_mean_high] = low, high
    summary[S.n_units] = int(len(uniq))
    # nested subsamples: the fit itself is redone (an in-sample fit is what drifts with n), in the profile's
    # pass (its subsets: judged_subsets)
    masks = stability.nested_units(inv, config.seed, stability.NESTED_FRACTIONS[:-1])
    part = [_subset_mean(prof.subset_linearity[j]) for j in range(len(masks))]
    sizes = [int(m.sum()) for m in masks]
    values, sizes = part + [float(np.mean(prof.linearity))], sizes + [n]
    summary.update(stability.record(KEY, values, sizes))
    summary[S.linearity_mean_large_n] = large_n(values, sizes)
    weakest = int(np.argmin(prof.linearity))
    null = nulls.permuted_pairing_scores(view[weakest], view[weakest + 1], config.null_permutations, config.seed,
                                         config.ridge)
    summary.update(stability.null_record(KEY, float(null.mean()),
                                         stability.add_one_p(float(prof.linearity[weakest]), null)))
    free = None
    k = int(sink_free.sum())
    if 0 < k < n and k - 1 > (0 if config.ridge else view.store.d_model):
        free = prof.subset_linearity[len(masks)]  # refitted on the sink-free rows in the profile's pass
        if not np.all(np.isfinite(free)):
            raise ValueError("sink-free rows: cannot normalise a matrix whose rows are all identical (zero variance)")
    elif k == n:
        free = prof.linearity  # no special token and no position 0 among the rows: the same score
    metrics[M.linearity_sink_free] = [None] * len(prof.linearity) if free is None else list(map(float, free))
    summary[S.linearity_sink_free_mean] = None if free is None else float(np.mean(free))
    summary[S.linearity_sink_free_min] = None if free is None else float(np.min(free))
    summary[S.sink_free_tokens] = k
    return metrics, summary


def compute(config: Config, inputs: Inputs) -> StudyResult:
    store = inputs.store
    rows, drawn = sample_mask(store, config.drop_special, config.skip_first, config.sample_tokens, config.seed)
    view = store.view(config.site).astype(torch.float32).take(rows)
    if len(view) < 2:
        raise LensInputError(f"linearity needs at least 2 layers of {config.site.value}; the store has {view.layers}")
    n, d = view.n_tokens, store.d_model
    if config.ridge == 0 and n - 1 <= d:
        raise LensInputError(
            f"linearity needs more tokens than d_model for a non-trivial least-squares map: got {n} tokens, "
            f"d_model {d}; raise --max-tokens or pass --param ridge=0.01")
    # the view is read one layer at a time (a list of it would hold every layer at once)
    units, unit_kind = split_units(store.tokens)
    sink_free = store.mask(True, max(1, config.skip_first))[rows]
    # one pass over the layers: the profile, and the refits the judgement reads (nested subsamples, sink-free)
    prof = geometry.linearity_profile(view, layers=view.layers, ridge=config.ridge,
                                      subsets=judged_subsets(np.asarray(units)[rows], sink_free, config.seed))
    src = prof.source_layers.tolist()
    texts = np.asarray(store.tokens["token"])[rows]
    classes = token_classes(texts)
    by_class = geometry.group_means(prof.nonlinearity, classes, order=TOKEN_CLASSES)
    by_tok = geometry.aggregate_by_token(prof.nonlinearity, texts, min_count=config.min_token_count)
    top_keys, _ = most_nonlinear(by_tok.keys, by_tok.mean, config.top_tokens)

    metrics = {M.linearity: prof.linearity, M.linearity_centered: prof.linearity_centered,
               M.nonlinearity_mean: prof.nonlinearity_mean}
    judged_metrics, judged_summary = judgement(view, prof, np.asarray(units)[rows], sink_free, config)
    metrics.update(judged_metrics)
    for j, key in enumerate(by_class.keys):
        metrics[M.nonlinearity(key)] = by_class.mean[:, j]
    class_mean = {str(k): float(by_class.mean[:, j].mean()) for j, k in enumerate(by_class.keys)}
    summary = {
        S.linearity_mean: float(np.mean(prof.linearity)), S.linearity_min: float(np.min(prof.linearity)),
        S.linearity_min_layer: int(src[int(np.argmin(prof.linearity))]),
        S.linearity_centered_mean: float(np.mean(prof.linearity_centered)),
        S.class_nonlinearity: class_mean,
        S.class_counts: {str(k): int(c) for k, c in zip(by_class.keys, by_class.count)},
        S.most_nonlinear_class: max(class_mean, key=class_mean.get) if class_mean else None,
        S.top_nonlinear_tokens: [str(k) for k in top_keys],
        S.bootstrap_unit: unit_kind, **judged_summary,
    }
    tok = store.tokens
    arrays = {
        A.layers: np.asarray(src), A.nonlinearity: prof.nonlinearity.astype(np.float32),
        A.token_index: rows, A.token: texts.astype(str), A.token_class: classes,
        **{c: np.asarray(tok[c])[rows] for c in (A.token_id, A.doc, A.window, A.pos)},
        A.class_keys: by_class.keys.astype(str), A.class_mean: by_class.mean, A.class_count: by_class.count,
        A.token_type_keys: by_tok.keys.astype(str), A.token_type_mean: by_tok.mean,
        A.token_type_count: by_tok.count,
    }
    return StudyResult(
        model=store.model_id, corpus=inputs.corpus, n_tokens=n, layers=src, metrics=metrics, summary=summary,
        arrays=arrays,
        extra={"site": config.site.value, "token_filter": config.token_filter(),
               "layer_meaning": f"transition l -> l+1 of {config.site.value}",
               "nonlinearity_scale": "sqrt(n) * row norm of the residual on normalised matrices; "
                                     "mean square = 1 - linearity", "sample": drawn})


def figures(result: StudyResult, config: Config) -> dict:
    m, a, model = result.metrics, result.arrays, result.model
    x = list(result.layers)
    main = go.Figure()
    main.add_trace(go.Scatter(x=x, y=m[M.linearity], mode="lines+markers", name="linearity"))
    main.add_trace(go.Scatter(x=x, y=m[M.linearity_centered], mode="lines+markers", name="linearity (centred)"))
    if M.linearity_sink_free in m:
        main.add_trace(go.Scatter(x=x, y=m[M.linearity_sink_free], mode="lines+markers",
                                  name="linearity, sink-free (no position 0)", line=dict(dash="dash")))
    main.add_trace(go.Scatter(x=x, y=m[M.nonlinearity_mean], mode="lines+markers",
                              name="mean per-token nonlinearity", yaxis="y2", line=dict(dash="dot")))
    main.update_layout(title=f"Linearity of layer l → l+1 — {model}", xaxis_title=RESULT.axis(result).title,
                       yaxis=dict(title="linearity score"),
                       yaxis2=dict(title="per-token nonlinearity", overlaying="y", side="right"),
                       template="plotly_white", hovermode="x unified")
    cls = go.Figure()
    for j, key in enumerate(a[A.class_keys]):
        cls.add_trace(go.Scatter(x=x, y=a[A.class_mean][:, j], mode="lines+markers",
                                 name=f"{key} (n={a[A.class_count][j]})"))
    cls.update_layout(title=f"Per-token nonlinearity by token class — {model}", xaxis_title=RESULT.axis(result).title,
                      yaxis_title="mean nonlinearity", template="plotly_white")
    top_keys, top_vals = most_nonlinear(a[A.token_type_keys], a[A.token_type_mean], config.top_tokens)
    tok = go.Figure(go.Bar(x=list(top_vals)[::-1], y=[repr(k) for k in top_keys][::-1], orientation="h"))
    tok.update_layout(title=f"Most nonlinear token types (mean over tokens and layers) — {model}",
                      xaxis_title="mean nonlinearity", yaxis_title="token type", template="plotly_white",
                      height=max(400, 22 * len(top_keys)))
    return {"main": main, "by-class": cls, "tokens": tok}


STUDY = Study(
    cost=40,  # seconds, scheduling hint: 36.5 s in make demo (2026-12-05, one pass over the layers, issue #38)
    config=Config, needs=needs, compute=compute, figures=figures,
    result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
