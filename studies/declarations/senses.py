"""What the senses study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import Headline, Names, ResultSpec, array, metric, scalar

_MEASURES = {"knn_accuracy": "leave-one-out cosine kNN sense accuracy within each lemma",
             "ari": "adjusted Rand index of k-means clusters against the senses",
             "ari_agglomerative": "adjusted Rand index of Ward clusters against the senses"}
M = Names(*(metric(k, doc) for k, doc in _MEASURES.items()),
          metric("{}__{}", "<measure> after <post-processing> (geometry.POSTPROCESSING)", attr="postprocessed"))
S = Names(
    scalar("chance", "kNN accuracy of guessing uniformly among a lemma's senses"),
    scalar("most_frequent_sense", "kNN accuracy of always answering a lemma's most frequent sense"),
    scalar("best_layer", "layer of the best kNN accuracy"),
    scalar("best_knn_accuracy", "best kNN accuracy over layers"),
    scalar("embedding_knn_accuracy", "kNN accuracy on the embedding layer (static baseline)"),
    scalar("best_ari", "best k-means ARI over layers"),
    scalar("best_ari_layer", "its layer"),
    scalar("embedding_ari", "k-means ARI on the embedding layer"),
    scalar("chance_ari", "ARI of random clusters"),
    scalar("n_lemmas", "lemmas evaluated"),
    scalar("n_contexts", "example contexts"),
    scalar("n_senses", "senses among them"),
    scalar("best_knn_accuracy__{}", "best kNN accuracy after a post-processing", attr="best_knn_accuracy_after"),
    scalar("best_layer__{}", "its layer", attr="best_layer_after"),
    scalar("best_ari__{}", "best k-means ARI after a post-processing", attr="best_ari_after"),
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

RESULT = ResultSpec(metrics=M, summary=S, arrays=A)
HEADLINES = (
        Headline("best-layer kNN sense accuracy", h.summary(S.best_knn_accuracy),
                 "above most-frequent-sense baseline, best in middle layers (SenseDict, WiC)"),
        Headline("most-frequent-sense baseline", h.summary(S.most_frequent_sense), "baseline"),
    )
CLAIMS = ()
