"""What the senses study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import Claim, Headline, LayerAxis, Names, ResultSpec, Rule, array, metric, scalar

_MEASURES = {"knn_accuracy": "leave-one-out cosine kNN sense accuracy within each lemma",
             "ari": "adjusted Rand index of k-means clusters against the senses",
             "ari_agglomerative": "adjusted Rand index of Ward clusters against the senses"}
_LABELS = {"knn_accuracy": ("kNN sense accuracy", "accuracy (0–1)"), "ari": ("k-means ARI vs senses", "ARI"),
           "ari_agglomerative": ("Ward-clustering ARI vs senses", "ARI")}
M = Names(*(metric(k, doc, title=_LABELS[k][0], unit=_LABELS[k][1]) for k, doc in _MEASURES.items()),
          metric("{}__{}", "<measure> after <post-processing> (geometry.POSTPROCESSING)", attr="postprocessed",
                 title="{} after {}", unit="as the measure"))
S = Names(
    scalar("chance", "kNN accuracy of guessing uniformly among a lemma's senses",
           title='chance accuracy', unit='accuracy (0–1)'),
    scalar("most_frequent_sense", "kNN accuracy of always answering a lemma's most frequent sense",
           title='most-frequent-sense baseline', unit='accuracy (0–1)'),
    scalar("best_layer", "layer of the best kNN accuracy", title='layer of the best kNN accuracy', unit='layer'),
    scalar("best_knn_accuracy", "best kNN accuracy over layers",
           title='kNN sense accuracy, best layer', unit='accuracy (0–1)'),
    scalar("embedding_knn_accuracy", "kNN accuracy on the embedding layer (static baseline)",
           title='kNN sense accuracy, embeddings', unit='accuracy (0–1)'),
    scalar("best_ari", "best k-means ARI over layers", title='k-means ARI, best layer', unit='ARI'),
    scalar("best_ari_layer", "its layer", title='layer of the best ARI', unit='layer'),
    scalar("embedding_ari", "k-means ARI on the embedding layer", title='k-means ARI, embeddings', unit='ARI'),
    scalar("chance_ari", "ARI of random clusters", title='ARI of random clusters', unit='ARI'),
    scalar("n_lemmas", "lemmas evaluated", title='lemmas', unit='lemmas'),
    scalar("n_contexts", "example contexts", title='contexts', unit='contexts'),
    scalar("n_senses", "senses among them", title='senses', unit='senses'),
    scalar("best_knn_accuracy__{}", "best kNN accuracy after a post-processing", attr="best_knn_accuracy_after",
           title='kNN sense accuracy, best layer, after {}', unit='accuracy (0–1)'),
    scalar("best_layer__{}", "its layer", attr="best_layer_after",
           title='layer of the best kNN accuracy, after {}', unit='layer'),
    scalar("best_ari__{}", "best k-means ARI after a post-processing", attr="best_ari_after",
           title='k-means ARI, best layer, after {}', unit='ARI'),
)
A = Names(
    array("knn_accuracy_all", "depth", "kNN accuracy, embedding layer first (index l + 1 = block l)"),
    array("ari_all", "depth", "k-means ARI, embedding layer first"),
    array("group_knn_accuracy", "layer lemma", "kNN accuracy per lemma"),
    array("lemmas", "lemma", "the lemmas, in group_knn_accuracy order"),
    array("projection_lemmas", "lemma", "lemmas with a 2-D projection"),
    array("proj__{}", "layer context 2", "2-D PCA of a lemma's contexts per layer", attr="projection"),
    array("proj_senses__{}", "context", "sense label of each projected context", attr="projection_senses"),
    array("proj_texts__{}", "context", "text of each projected context", attr="projection_texts"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A,
                    layer_axis=LayerAxis(note="the arrays *_all have the embeddings first, block l at l + 1"))
HEADLINES = (
        Headline("best-layer kNN sense accuracy", h.summary(S.best_knn_accuracy),
                 "above most-frequent-sense baseline, best in middle layers (SenseDict, WiC)"),
        Headline("most-frequent-sense baseline", h.summary(S.most_frequent_sense), "baseline"),
    )
CLAIMS = (
    Claim("best kNN sense accuracy − most-frequent-sense baseline", "contextual states separate word senses "
          "better than the most-frequent-sense baseline", "SenseDict; WiC; ELMo",
          h.difference(S.best_knn_accuracy, S.most_frequent_sense),
          Rule("agrees > 0 (above the baseline); else contradicts", agrees=(1e-12, None)), unit="accuracy points"),
)
