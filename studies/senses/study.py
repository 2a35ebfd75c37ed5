"""Study: word-sense separation per layer on WordNet 3.0 example sentences.

Contexts: every example sentence of a synset of a polysemous lemma (≥ 2 senses with ≥ 2 located
examples each; :mod:`lens.text.wordnet`), its target word's state at every layer = the mean of its
sub-token states (:func:`lens.capturing.spans.span_states`). Per ``resid_post`` layer:

- ``knn_accuracy``: leave-one-out cosine kNN sense accuracy within each lemma (:mod:`probes.knn`;
  the kNN sense probe of Wiedemann et al. 2019), against ``chance`` and ``most_frequent_sense``
  computed on the same contexts and the embedding layer's states (the static, context-free
  baseline: ``embedding_knn_accuracy``);
- ``ari``: k-means with k = number of senses against the labels (adjusted Rand index; 0 = chance),
  ``ari_agglomerative`` (Ward), and their embedding-layer values;
- the same after clipping outlier values or standardising dimensions (``<metric>__clip``,
  ``<metric>__standardize``; Timkey & van Schijndel 2021: rogue dimensions distort cosine).

The judged claim (contextual states pick a context's sense better than a sense-blind guess: Peters et al.
2018, Table 5) is read at a layer chosen without the lemmas it is scored on: the lemmas are split into two
seeded halves and each half is scored at the layer that is best on the other (``heldout_knn_accuracy``), minus
the stronger of the two sense-blind baselines (``sense_margin``); its 95% interval resamples whole lemmas (the
unit of independence: a context is compared only with the other contexts of its lemma), and it is recomputed on
nested subsamples of the lemmas (:mod:`studies.core.stability`).

The folder also holds ``sense_dict.npz``: a :class:`geometry.senses.SenseDict` of the labelled
sense centroids at the best layer. ``corpus`` and ``max_tokens`` are unused (the corpus is
WordNet's examples).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lens.runtime.threads import serial
from studies.core import stability
from studies.core.config import StudyConfig
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.senses.declaration import A, CLAIMS, HEADLINES, M, RESULT, S
from geometry.postprocess import postprocess
from geometry.senses import SenseDict, pca_2d, sense_clustering
from probes.knn import KnnSenseProbe
from lens.capturing.spans import span_states
from lens.text.wordnet import sense_contexts

log = logging.getLogger(__name__)

SENSE_DICT = "sense_dict.npz"


@dataclass(frozen=True)
class Config(StudyConfig):
    """``lemmas``: words or ``word.pos`` keys (empty: all qualifying lemmas, ``max_lemmas`` of them
    drawn with ``seed``); ``k``: kNN neighbours; ``postprocessing``: names from
    ``geometry.POSTPROCESSING`` also evaluated; ``n_projection_lemmas``: lemmas with a 2-D
    projection per layer (those with the most contexts); ``n_boot``: lemma-bootstrap resamples of the judged
    margin's interval; ``n_null``: permutations of the senses within each lemma for its null (0: none)."""

    corpus: str = "wordnet-3.0"
    lemmas: tuple = ()
    max_lemmas: int | None = 100
    min_examples: int = 2
    k: int = 1
    postprocessing: tuple = ("clip", "standardize")
    n_projection_lemmas: int = 4
    batch_size: int = 32
    n_boot: int = 1000
    n_null: int = 200


def needs(config: Config) -> Needs:
    return Needs(model=True)


def _evaluate(S_, senses, groups, cfg: Config, pp: str) -> tuple[dict, object, object]:
    """({measure: (depth,) values}, kNN result, clustering result) after post-processing ``pp``."""
    # post-processing is fitted per layer on all contexts together, then both kNN and clustering see it
    X = S_ if pp == "raw" else np.stack([postprocess(S_[l], pp).cpu().numpy() for l in range(len(S_))])
    knn = KnnSenseProbe(k=cfg.k).fit(X, senses, groups).result_
    clus = sense_clustering(X, senses, groups, seed=cfg.seed)
    return ({M.knn_accuracy: knn.accuracy, M.ari: clus.by_method("kmeans"),
             M.ari_agglomerative: clus.by_method("agglomerative")}, knn, clus)


def first_half(n: int, seed: int = 0) -> np.ndarray:
    """Boolean mask of the seeded first half (n // 2) of n lemmas."""
    first = np.zeros(n, bool)
    first[np.random.default_rng(seed).permutation(n)[: n // 2]] = True
    return first


def crossfit_accuracy(acc: np.ndarray, sizes: np.ndarray, seed: int = 0) -> tuple[np.ndarray, list[int]]:
    """Per lemma, its kNN accuracy at a layer chosen on other lemmas, and the two chosen layers.

    ``acc`` (layer, lemma): kNN accuracy of each lemma at each block; ``sizes`` (lemma,): its contexts. The
    lemmas are split into two seeded halves; each half is read at the layer whose context-weighted accuracy
    is best on the other half, so the best of many layers is never scored on the data that picked it."""
    acc, sizes = np.asarray(acc, np.float64), np.asarray(sizes, np.float64)
    n = acc.shape[1]
    if n < 2:
        raise ValueError(f"a held-out layer choice needs at least 2 lemmas, got {n}")
    first = first_half(n, seed)
    out, chosen = np.empty(n), []
    for part in (first, ~first):
        w = sizes[~part]
        layer = int(np.argmax(acc[:, ~part] @ w / w.sum()))
        out[part] = acc[layer, part]
        chosen.append(layer)
    return out, chosen


def sense_margin(heldout, chance, mfs, sizes, n_boot: int = 1000, seed: int = 0
                 ) -> tuple[float, float, float, float]:
    """(accuracy, margin, low, high): the context-weighted held-out kNN accuracy, its margin over the stronger
    sense-blind baseline (max of chance and most-frequent-sense, each context-weighted over the same lemmas), and
    the margin's 95% percentile interval with whole lemmas resampled (``n_boot`` times)."""
    per = np.stack([np.asarray(v, np.float64) for v in (heldout, chance, mfs)])  # (3, lemma)
    n = np.asarray(sizes, np.float64)

    def margins(w):  # w (lemma, boot) -> (accuracy, margin) per column
        tot = n @ w
        a, c, f = ((per * n) @ w) / tot
        return a, a - np.maximum(c, f)

    acc, value = (float(v[0]) for v in margins(np.ones((len(n), 1))))
    G = len(n)
    w = np.random.default_rng(seed).multinomial(G, np.full(G, 1.0 / G), size=n_boot).T
    boot = margins(w)[1]
    return acc, value, float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))


def shuffled_margins(states, senses, groups, knn, layers: list[int], config: Config) -> np.ndarray:
    """The judged margin with each lemma's sense labels permuted among its contexts (``config.n_null`` times):
    each half of the lemmas read at the block chosen for it on the real labels (``layers``). A permutation within
    a lemma keeps its sense counts, so chance and most-frequent-sense are unchanged; the null's mean is chance."""
    names = np.asarray(knn.groups)
    kept = np.isin(groups, names)
    lemma = np.searchsorted(names, groups[kept])
    s, g = np.asarray(senses)[kept], np.asarray(groups)[kept]
    half = first_half(len(names), config.seed)[lemma]
    members = [np.flatnonzero(lemma == i) for i in range(len(names))]
    baseline = max(knn.chance, knn.most_frequent_sense)
    x = {layer: np.asarray(states[layer + 1])[kept] for layer in set(layers)}   # states: embeddings first
    rng = np.random.default_rng(config.seed + 1)
    out = np.empty(config.n_null)
    for b in range(config.n_null):
        perm = s.copy()
        for m in members:
            perm[m] = s[rng.permutation(m)]
        right = 0.0
        for part, layer in zip((half, ~half), layers):
            r = KnnSenseProbe(k=config.k).fit([x[layer][part]], perm[part], g[part]).result_
            right += r.accuracy[0] * r.n_contexts
        out[b] = right / len(s) - baseline
    return out


def _judged(knn, config: Config, states=None, senses=None, groups=None) -> dict:
    """The judged claim's summary entries: held-out kNN accuracy, its margin over the sense-blind baselines with
    a lemma-bootstrap interval, and the margin on nested subsamples of the lemmas."""
    acc = np.asarray(knn.group_accuracy)[1:]                 # blocks only, as best_knn_accuracy
    sizes, chance, mfs = knn.group_sizes, knn.group_chance, knn.group_most_frequent_sense
    heldout, layers = crossfit_accuracy(acc, sizes, config.seed)
    accuracy, margin, low, high = sense_margin(heldout, chance, mfs, sizes, config.n_boot, config.seed)
    lemma_of_context = np.repeat(np.arange(len(sizes)), sizes)

    def statistic(mask):
        keep = np.unique(lemma_of_context[mask])
        h, _ = crossfit_accuracy(acc[:, keep], sizes[keep], config.seed)
        return sense_margin(h, chance[keep], mfs[keep], sizes[keep], 1, config.seed)[1]

    values, counts = stability.nested_values(statistic, lemma_of_context, config.seed)
    out = {S.heldout_knn_accuracy: accuracy, S.heldout_layers: layers,
           S.sense_blind_baseline: float(max(knn.chance, knn.most_frequent_sense)),
           S.sense_margin: margin, S.sense_margin_low: low, S.sense_margin_high: high,
           **stability.record(S.sense_margin, values, counts)}
    if config.n_null and states is not None:
        null = shuffled_margins(states, senses, groups, knn, layers, config)
        out.update(stability.null_record(S.sense_margin, float(null.mean()), stability.add_one_p(margin, null)))
    return out


def compute(config: Config, inputs: Inputs) -> StudyResult:
    contexts = sense_contexts(config.lemmas or None, max_lemmas=config.max_lemmas,
                              min_examples=config.min_examples, seed=config.seed)
    model = inputs.model
    texts = np.array([c.text for c in contexts])
    states = span_states(model, list(texts), [(c.start, c.end) for c in contexts], batch_size=config.batch_size,
                         progress=config.progress)  # (1 + n_layers, context, d_model): embed first
    # the rest is small per-layer work on hundreds of contexts: one thread (lens.runtime.threads.serial); pooled,
    # each op waits at its barrier on a busy machine (the post-processing: 3.3 s against 0.5 s at load ~5)
    with serial():
        return _analyse(config, model, contexts, texts, states)


def _analyse(config: Config, model, contexts, texts: np.ndarray, states: np.ndarray) -> StudyResult:
    senses = np.array([c.sense for c in contexts])
    groups = np.array([c.lemma for c in contexts])
    layers = list(range(model.n_layers))
    raw, knn, clus = _evaluate(states, senses, groups, config, "raw")
    metrics = {k: list(v[1:]) for k, v in raw.items()}
    for pp in config.postprocessing:
        for k, v in _evaluate(states, senses, groups, config, pp)[0].items():
            metrics[M.postprocessed(k, pp)] = list(v[1:])
    resid = raw[M.knn_accuracy][1:]
    best = int(np.argmax(resid))
    summary = {
        S.chance: knn.chance, S.most_frequent_sense: knn.most_frequent_sense, S.best_layer: best,
        S.best_knn_accuracy: float(resid[best]), S.embedding_knn_accuracy: float(raw[M.knn_accuracy][0]),
        S.best_ari: float(np.max(raw[M.ari][1:])), S.best_ari_layer: int(np.argmax(raw[M.ari][1:])),
        S.embedding_ari: float(raw[M.ari][0]), S.chance_ari: clus.chance, S.n_lemmas: knn.n_groups,
        S.n_contexts: knn.n_contexts, S.n_senses: int(len(np.unique(senses))), **_judged(knn, config, states, senses, groups),
    }
    for pp in config.postprocessing:
        acc = np.asarray(metrics[M.postprocessed(M.knn_accuracy, pp)])
        summary[S.best_knn_accuracy_after(pp)] = float(acc.max())
        summary[S.best_layer_after(pp)] = int(acc.argmax())
        summary[S.best_ari_after(pp)] = float(np.max(metrics[M.postprocessed(M.ari, pp)]))
    arrays = {A.knn_accuracy_all: raw[M.knn_accuracy], A.ari_all: raw[M.ari],
              A.group_knn_accuracy: knn.group_accuracy[1:], A.lemmas: knn.groups}
    lemmas, counts = np.unique(groups, return_counts=True)
    chosen = [str(l) for l in lemmas[np.argsort(-counts, kind="stable")][:config.n_projection_lemmas]]
    arrays[A.projection_lemmas] = np.array(chosen)
    for lemma in chosen:
        m = groups == lemma
        arrays[A.projection(lemma)] = np.stack([pca_2d(states[l + 1][m]) for l in layers]).astype(np.float32)
        arrays[A.projection_senses(lemma)], arrays[A.projection_texts(lemma)] = senses[m], texts[m]
    log.info("senses: best layer %d, kNN %.3f (chance %.3f, MFS %.3f, embedding %.3f)", best, resid[best],
             knn.chance, knn.most_frequent_sense, summary[S.embedding_knn_accuracy])
    return StudyResult(model=model.model_id, corpus=config.corpus, n_tokens=len(contexts), layers=layers,
                       metrics=metrics, summary=summary, arrays=arrays,
                       files={SENSE_DICT: SenseDict().fit(states[best + 1], groups, senses=senses)})


def figures(result: StudyResult, config: Config) -> dict:
    m, s, a, x = result.metrics, result.summary, result.arrays, list(result.layers)
    fig = make_subplots(rows=1, cols=2, subplot_titles=["kNN sense accuracy (leave-one-out)",
                                                        "clustering agreement (ARI, k-means)"])
    colours = {"raw": "rgb(31,119,180)", "clip": "rgb(44,160,44)", "standardize": "rgb(214,39,40)"}
    for pp in ("raw",) + tuple(config.postprocessing):
        style = dict(color=colours.get(pp, "grey"), dash=None if pp == "raw" else "dot")
        knn, ari = (k if pp == "raw" else M.postprocessed(k, pp) for k in (M.knn_accuracy, M.ari))
        fig.add_trace(go.Scatter(x=x, y=m[knn], name=pp, legendgroup=pp, mode="lines+markers", line=style),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=m[ari], name=pp, legendgroup=pp, showlegend=False, mode="lines+markers",
                                 line=style), row=1, col=2)
    for y, label, dash in ((s[S.chance], "chance", "dash"), (s[S.most_frequent_sense], "most frequent sense", "dot"),
                           (s[S.embedding_knn_accuracy], "embedding layer (static)", "dashdot")):
        fig.add_hline(y=y, line_dash=dash, line_color="black", annotation_text=label, row=1, col=1)
    fig.add_hline(y=s[S.embedding_ari], line_dash="dashdot", line_color="black",
                  annotation_text="embedding layer (static)", row=1, col=2)
    fig.add_hline(y=s[S.chance_ari], line_dash="dash", line_color="black", annotation_text="chance", row=1, col=2)
    fig.update_xaxes(title_text="layer (resid_post)")
    fig.update_yaxes(title_text="accuracy (share of held-out contexts)", row=1, col=1)
    fig.update_yaxes(title_text="adjusted Rand index", row=1, col=2)
    fig.update_layout(title=f"Word senses per layer — {result.model} (WordNet 3.0 examples)",
                      template="plotly_white", height=480)
    figs = {"main": fig}
    chosen = [str(l) for l in a[A.projection_lemmas]]
    if chosen:  # the lemma with the most contexts, one frame per layer
        lemma = chosen[0]
        figs["projection"] = _projection_figure(x, a[A.projection(lemma)], a[A.projection_senses(lemma)],
                                                a[A.projection_texts(lemma)], lemma)
    return figs


def _projection_figure(layers, proj, senses, texts, lemma: str):
    fig = go.Figure()
    names = sorted(set(senses.tolist()))
    for i, _ in enumerate(layers):
        for s in names:
            m = senses == s
            fig.add_trace(go.Scatter(x=proj[i, m, 0], y=proj[i, m, 1], mode="markers", name=s, text=texts[m],
                                     hovertemplate="%{text}<extra>" + s + "</extra>", visible=i == len(layers) // 2,
                                     legendgroup=s, showlegend=True, marker=dict(size=10)))
    per = len(names)
    steps = [dict(method="update", label=str(l),
                  args=[{"visible": [j // per == i for j in range(per * len(layers))]}]) for i, l in enumerate(layers)]
    fig.update_layout(sliders=[dict(active=len(layers) // 2, steps=steps, currentvalue={"prefix": "layer "})],
                      title=f"{lemma}: contexts by sense (PCA of each layer's states)", template="plotly_white",
                      xaxis_title="first principal component", yaxis_title="second principal component")
    return fig


STUDY = Study(
    cost=20,
    config=Config, needs=needs, compute=compute, figures=figures, result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
