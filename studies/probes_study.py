"""Study: character probe per layer with a control task (Hewitt & Liang 2019), plus an ELMo scalar mix.

Label: does the token's text contain ``letter``? A token's spelling is not in its id's embedding
in any obvious way, yet models answer spelling questions; the probe asks at which layers it can be
read linearly. The control task gives each token type a random label with the same base rate;
selectivity = accuracy − control accuracy says how much of the accuracy is more than memorising
token identity. Folds are grouped by document (or capture window when there are few documents).
Both tasks use one probe configuration, the regularisation strength the real task chose in each fold
(``control_strength="shared"``, as Hewitt & Liang compare them); ``"per_task"`` is the named variant
where the control task chooses its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lens.errors import LensInputError
from studies import sample_size
from studies.config import SiteConfig
from studies.contract import Inputs, Needs, Study, StudyResult
from studies.sampling import sample_split_units
from studies.declarations.probes_study import A, CLAIMS, HEADLINES, M, RESULT, S


@dataclass(frozen=True)
class Config(SiteConfig):
    """``letter``: the character probed; ``kind``: "ridge" (fast, default) or "logistic";
    ``max_probe_tokens``: tokens sampled (whole documents/windows kept together) for the probes;
    ``scalar_mix``: also fit the ELMo-style mix over layers; ``control_strength``: "shared" (the control
    task is fitted with the strength the real task chose, one probe configuration) or "per_task";
    ``fit_size``: "mark" or "refuse" an underdetermined fit (:mod:`studies.sample_size`)."""

    letter: str = "e"
    kind: str = "ridge"
    n_folds: int = 5
    max_probe_tokens: int = 4000
    scalar_mix: bool = True
    split_by: str = "auto"
    min_docs: int = 10
    control_strength: str = "shared"
    fit_size: str = "mark"


def check(config: Config) -> None:
    sample_size.check_action("probes", config.fit_size)
    from probes.linear_probe import CONTROL_STRENGTHS

    if config.control_strength not in CONTROL_STRENGTHS:
        raise LensInputError(f"control_strength: expected one of {CONTROL_STRENGTHS}, got {config.control_strength!r}")
    if not isinstance(config.letter, str) or len(config.letter) != 1:
        raise LensInputError(f"letter: expected a single character, got {config.letter!r}")


def needs(config: Config) -> Needs:
    return Needs(sites=(config.site,))


def compute(config: Config, inputs: Inputs) -> StudyResult:
    from probes.linear_probe import LinearProbe, char_labels
    from probes.scalar_mix import ScalarMixProbe

    store = inputs.store
    toks = store.tokens
    rows, units, unit_kind = sample_split_units(toks, store.mask(), config.split_by, config.min_docs,
                                                config.max_probe_tokens, config.seed)
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
                        progress=config.progress, control_strength=config.control_strength).fit(X, labels, word_types=np.asarray(toks["token_id"])[rows],
                                                      groups=units[rows]).result_
    except ValueError as exc:
        raise LensInputError(f"{exc} ({len(rows)} probe tokens in {n_units} {unit_kind}s; raise --max-tokens, "
                             f"or --param max_probe_tokens above {config.max_probe_tokens})") from None
    # each fold's probe is fitted on the other folds' tokens
    size = sample_size.check_fit_size("probes", "the linear probes", len(rows) * (n_folds - 1) // max(n_folds, 1),
                                      store.d_model, config.fit_size)
    metrics = {M.accuracy: r.accuracy, M.selectivity: r.selectivity, M.control_accuracy: r.control_accuracy,
               M.accuracy_std: r.accuracy_std}
    sel_best = int(np.nanargmax(r.selectivity))
    summary = {S.best_layer: r.best_layer, S.best_accuracy: float(np.nanmax(r.accuracy)),
               S.best_selectivity_layer: int(layer_ids[sel_best]),
               S.best_selectivity: float(r.selectivity[sel_best]), S.majority: r.majority,
               S.positive_share: float(labels.mean()), S.letter: config.letter, S.kind: config.kind,
               S.n_probe_tokens: int(len(rows)), S.split_unit: unit_kind, S.n_folds: n_folds,
               S.control_strength: config.control_strength, **size.summary()}
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


def figures(result: StudyResult, config: Config) -> dict:
    import plotly.graph_objects as go

    m, s, x = result.metrics, result.summary, result.layers
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=m[M.accuracy], mode="markers+lines", name="accuracy (real task)",
                             error_y=dict(type="data", array=m[M.accuracy_std])))
    fig.add_trace(go.Scatter(x=x, y=m[M.control_accuracy], mode="markers+lines", name="control task"))
    fig.add_trace(go.Scatter(x=x, y=m[M.selectivity], mode="markers+lines", name="selectivity"))
    fig.add_hline(y=s[S.majority], line_dash="dot", annotation_text="majority label")
    fig.update_layout(title=f"Character probe (token contains {s[S.letter]!r}) — {result.model}, "
                            f"{result.n_tokens} tokens, {s[S.kind]}",
                      xaxis_title="layer", yaxis_title="cross-validated accuracy", template="plotly_white")
    return {"main": fig}


STUDY = Study(
    cost=30,
    config=Config, check=check, needs=needs, compute=compute, figures=figures,
    result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
