"""Study: word-sense separation per layer on WordNet 3.0 example sentences.

Contexts: every example sentence of a synset of a polysemous lemma (≥ 2 senses with ≥ 2 located
examples each; :mod:`lens.wordnet`), its target word's state at every layer = the mean of its
sub-token states (:func:`lens.spans.span_states`). Per ``resid_post`` layer:

- ``knn_accuracy``: leave-one-out cosine kNN sense accuracy within each lemma (:mod:`probes.knn`;
  the kNN sense probe of Wiedemann et al. 2019), against ``chance`` and ``most_frequent_sense``
  computed on the same contexts and the embedding layer's states (the static, context-free
  baseline: ``embedding_knn_accuracy``);
- ``ari``: k-means with k = number of senses against the labels (adjusted Rand index; 0 = chance),
  ``ari_agglomerative`` (Ward), and their embedding-layer values;
- the same after clipping outlier values or standardising dimensions (``<metric>__clip``,
  ``<metric>__standardize``; Timkey & van Schijndel 2021: rogue dimensions distort cosine).

Arrays: ``knn_accuracy_all`` / ``ari_all`` include the embedding layer (index 0 = embed, l + 1 =
block l); ``group_knn_accuracy`` (layer, lemma); a 2-D PCA projection of a few lemmas' contexts per
layer (``proj__<lemma>`` (layer, context, 2), ``proj_senses__<lemma>``, ``proj_texts__<lemma>``;
lemma names in ``projection_lemmas``) so the explorer can colour one lemma's contexts by sense with a
layer slider. The folder also holds ``sense_dict.npz``: a :class:`geometry.senses.SenseDict` of the
labelled sense centroids at the best layer.

``corpus`` and ``max_tokens`` are unused (the corpus is WordNet's examples).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from geometry.postprocess import postprocess
from geometry.senses import SenseDict, pca_2d, sense_clustering
from lens.spans import span_states
from lens.wordnet import sense_contexts
from probes.knn import KnnSenseProbe
from studies.common import StudyConfig, cached_model
from studies.results import write_result

log = logging.getLogger(__name__)

STUDY = "senses"


@dataclass(frozen=True)
class Config(StudyConfig):
    """``lemmas``: words or ``word.pos`` keys (empty: all qualifying lemmas, ``max_lemmas`` of them
    drawn with ``seed``); ``k``: kNN neighbours; ``postprocessing``: names from
    ``geometry.POSTPROCESSING`` also evaluated; ``n_projection_lemmas``: lemmas with a 2-D
    projection per layer (those with the most contexts)."""

    corpus: str = "wordnet-3.0"
    lemmas: tuple = ()
    max_lemmas: int | None = 100
    min_examples: int = 2
    k: int = 1
    postprocessing: tuple = ("clip", "standardize")
    n_projection_lemmas: int = 4
    batch_size: int = 32


def _evaluate(S, senses, groups, suffix: str, cfg: Config, pp: str) -> dict:
    # post-processing is fitted per layer on all contexts together, then both kNN and clustering see it
    X = S if pp == "raw" else np.stack([postprocess(S[l], pp).cpu().numpy() for l in range(len(S))])
    knn = KnnSenseProbe(k=cfg.k).fit(X, senses, groups).result_
    clus = sense_clustering(X, senses, groups, seed=cfg.seed)
    return {f"knn_accuracy{suffix}": knn.accuracy, f"ari{suffix}": clus.by_method("kmeans"),
            f"ari_agglomerative{suffix}": clus.by_method("agglomerative"), "_knn": knn, "_clus": clus}


def _figures(layers, ev: dict, pps, model: str) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=["kNN sense accuracy (leave-one-out)",
                                                        "clustering agreement (ARI, k-means)"])
    x = list(layers)
    knn, clus = ev["_knn"], ev["_clus"]
    colours = {"": "rgb(31,119,180)", "__clip": "rgb(44,160,44)", "__standardize": "rgb(214,39,40)"}
    for sfx in [""] + [f"__{p}" for p in pps]:
        name = "raw" if not sfx else sfx[2:]
        style = dict(color=colours.get(sfx, "grey"), dash=None if not sfx else "dot")
        fig.add_trace(go.Scatter(x=x, y=ev[f"knn_accuracy{sfx}"][1:], name=name, legendgroup=name,
                                 mode="lines+markers", line=style), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=ev[f"ari{sfx}"][1:], name=name, legendgroup=name, showlegend=False,
                                 mode="lines+markers", line=style), row=1, col=2)
    for y, label, dash in ((knn.chance, "chance", "dash"), (knn.most_frequent_sense, "most frequent sense", "dot"),
                           (float(ev["knn_accuracy"][0]), "embedding layer (static)", "dashdot")):
        fig.add_hline(y=y, line_dash=dash, line_color="black", annotation_text=label, row=1, col=1)
    fig.add_hline(y=float(ev["ari"][0]), line_dash="dashdot", line_color="black",
                  annotation_text="embedding layer (static)", row=1, col=2)
    fig.add_hline(y=clus.chance, line_dash="dash", line_color="black", annotation_text="chance", row=1, col=2)
    fig.update_xaxes(title_text="layer (resid_post)")
    fig.update_layout(title=f"Word senses per layer — {model} (WordNet 3.0 examples)", template="plotly_white",
                      height=480)
    return fig


def _projection_figure(layers, proj, senses, texts, lemma: str) -> go.Figure:
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
                      title=f"{lemma}: contexts by sense (PCA of each layer's states)", template="plotly_white")
    return fig


def run(config: Config, out_dir) -> Path:
    t0 = time.time()
    contexts = sense_contexts(config.lemmas or None, max_lemmas=config.max_lemmas,
                              min_examples=config.min_examples, seed=config.seed)
    model = cached_model(config.model, config.device)
    texts = np.array([c.text for c in contexts])
    senses = np.array([c.sense for c in contexts])
    groups = np.array([c.lemma for c in contexts])
    S = span_states(model, list(texts), [(c.start, c.end) for c in contexts], batch_size=config.batch_size,
                    progress=config.progress)  # (1 + n_layers, context, d_model): embed first
    layers = list(range(model.n_layers))
    ev = _evaluate(S, senses, groups, "", config, "raw")
    for pp in config.postprocessing:
        ev.update({k: v for k, v in _evaluate(S, senses, groups, f"__{pp}", config, pp).items()
                   if not k.startswith("_")})
    knn, clus = ev["_knn"], ev["_clus"]
    resid = ev["knn_accuracy"][1:]
    best = int(np.argmax(resid))
    metrics = {k: list(v[1:]) for k, v in ev.items() if not k.startswith("_")}
    summary = {
        "chance": knn.chance, "most_frequent_sense": knn.most_frequent_sense, "best_layer": best,
        "best_knn_accuracy": float(resid[best]), "embedding_knn_accuracy": float(ev["knn_accuracy"][0]),
        "best_ari": float(np.max(ev["ari"][1:])), "best_ari_layer": int(np.argmax(ev["ari"][1:])),
        "embedding_ari": float(ev["ari"][0]), "chance_ari": clus.chance, "n_lemmas": knn.n_groups,
        "n_contexts": knn.n_contexts, "n_senses": int(len(np.unique(senses))),
    }
    for pp in config.postprocessing:
        acc = ev[f"knn_accuracy__{pp}"][1:]
        summary[f"best_knn_accuracy__{pp}"] = float(acc.max())
        summary[f"best_layer__{pp}"] = int(acc.argmax())
        summary[f"best_ari__{pp}"] = float(ev[f"ari__{pp}"][1:].max())
    arrays = {"knn_accuracy_all": ev["knn_accuracy"], "ari_all": ev["ari"],
              "group_knn_accuracy": knn.group_accuracy[1:], "lemmas": knn.groups}
    lemmas, counts = np.unique(groups, return_counts=True)
    chosen = [str(l) for l in lemmas[np.argsort(-counts, kind="stable")][:config.n_projection_lemmas]]
    arrays["projection_lemmas"] = np.array(chosen)
    figs = {"main": _figures(layers, ev, config.postprocessing, model.model_id)}
    for j, lemma in enumerate(chosen):
        m = groups == lemma
        proj = np.stack([pca_2d(S[l + 1][m]) for l in layers]).astype(np.float32)
        arrays[f"proj__{lemma}"], arrays[f"proj_senses__{lemma}"] = proj, senses[m]
        arrays[f"proj_texts__{lemma}"] = texts[m]
        if j == 0:
            figs["projection"] = _projection_figure(layers, proj, senses[m], texts[m], lemma)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    SenseDict().fit(S[best + 1], groups, senses=senses).save(out / "sense_dict.npz")
    write_result(out, study=STUDY, model=model.model_id, corpus=config.corpus, n_tokens=len(contexts),
                 config=config, layers=layers, metrics=metrics, summary=summary, arrays=arrays, figures=figs,
                 wall_time_s=time.time() - t0, extra={"layer_axis": "resid_post; arrays *_all have embed at 0"})
    log.info("senses: best layer %d, kNN %.3f (chance %.3f, MFS %.3f, embedding %.3f)", best, resid[best],
             knn.chance, knn.most_frequent_sense, summary["embedding_knn_accuracy"])
    return out
