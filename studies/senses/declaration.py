"""What the senses study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.core.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.core.registry.declaration`)."""

from __future__ import annotations

from studies.reporting import headlines as h
from studies.core import stability
from studies.core.precision import CURVE_COMMAND, Precision
from studies.core.contract import (Claim, Headline, LayerAxis, Names, ResultSpec, Rule, array, interval_scalars, metric,
                              scalar)

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
    scalar("heldout_knn_accuracy", "kNN accuracy with the layer chosen on the other half of the lemmas "
           "(studies.senses.study.crossfit_accuracy)", title='kNN sense accuracy, held-out layer choice',
           unit='accuracy (0–1)'),
    scalar("heldout_layers", "the layers chosen for the two halves of the lemmas",
           title='layers chosen on the other half', unit='layer'),
    scalar("sense_blind_baseline", "the stronger sense-blind baseline: max(chance, most_frequent_sense)",
           title='sense-blind baseline (max of chance, most frequent sense)', unit='accuracy (0–1)'),
    *interval_scalars("sense_margin", "heldout_knn_accuracy − sense_blind_baseline (the judged claim)",
                      title="kNN sense accuracy − sense-blind baseline", unit="accuracy points",
                      how="2.5% of the margin's lemma bootstrap"),
    *stability.SCALARS,
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
        Headline("kNN sense accuracy − sense-blind baseline (held-out layer)", h.summary(S.sense_margin),
                 "> 0: contextual states pick a context's sense better than a sense-blind guess (Peters et al. "
                 "2018, Table 5; Wiedemann et al. 2019)"),
        Headline("best-layer kNN sense accuracy", h.summary(S.best_knn_accuracy),
                 "in-sample best of the layers (the judged value chooses its layer on other lemmas)"),
        Headline("most-frequent-sense baseline", h.summary(S.most_frequent_sense), "baseline"),
    )


def _predates(rec) -> str | None:
    if rec.summary.get(S.sense_margin) is None:
        return ("the result predates the held-out sense margin (sense_margin); rerun the study to judge it on "
                "the paper's statistic")
    return None


PAPER = ("Nearest-neighbour word-sense disambiguation with a model's contextual states beats the sense-blind "
         "most-frequent-sense baseline. Peters et al. 2018 (ELMo) §5.3, Table 5: 1-NN to sense centroids of "
         "SemCor, F1 on the Raganato et al. 2017 all-words suite: biLM first layer 67.4, second layer 69.0, "
         "against the WordNet first-sense baseline 65.9 (+1.5 and +3.1 points; CoVe's layers, 59.4 and 64.7, "
         "fall below it). Coenen/Reif et al. 2019 §4.1: BERT-base, nearest sense centroid, F1 71.1. "
         "Wiedemann et al. 2019: kNN over sense-labelled BERT contexts, F1 76.5 (SensEval-2 lexical sample), "
         "80.1 (SensEval-3). Each is read at a stated layer (or all of them), on test items not used to pick it.")
METHOD = ("Leave-one-out cosine 1-NN within each lemma over WordNet 3.0's example sentences (probes.knn), per "
          "block. The layer is chosen without the lemmas it is scored on: the lemmas are split into two seeded "
          "halves and each half is read at the block best on the other half (heldout_knn_accuracy; the in-sample "
          "best_knn_accuracy is the maximum over ~30 blocks on the same contexts and is not judged). The "
          "comparator is the stronger sense-blind baseline on the same contexts: chance (a random other context "
          "of the lemma shares the sense: the 1-NN accuracy of an uninformative state) or most-frequent-sense "
          "among the other contexts. Leaving one out makes the left-out sense a minority in a balanced lemma, so "
          "that baseline alone falls below chance (0 for two senses of two examples each) and beating it says "
          "little. 95% interval: 1000 bootstrap resamples of whole lemmas (the unit of independence: a context "
          "is only compared with its lemma's other contexts), the held-out layer choice kept; nested: the margin "
          "on a quarter and a half of the lemmas, layers rechosen; null: the senses permuted among each lemma's "
          "contexts (200 times) and read at the same layers — its mean margin is 0 when chance is the stronger "
          "baseline (chance is the null's expected accuracy).")
INSTRUMENT = ("leave-one-out 1-NN among WordNet's example sentences (a few per sense), not the paper's nearest "
              "SemCor sense centroid scored on the Senseval/SemEval test sets; its margin is not on their F1 "
              "scale, so only its sign is judged")
CLAIMS = (
    Claim("kNN sense accuracy at a held-out layer − sense-blind baseline",
          "contextual states pick a context's word sense better than a sense-blind guess (the most-frequent-sense "
          "baseline of the WSD papers)", "Peters et al. 2018 (ELMo, Table 5); Coenen et al. 2019; "
          "Wiedemann et al. 2019", h.summary(S.sense_margin),
          Rule("agrees: margin > 0 (the whole interval above the sense-blind baseline); contradicts: ≤ 0",
               agrees=(1e-12, None)),
          low=h.summary(S.sense_margin_low), high=h.summary(S.sense_margin_high), unit="accuracy points",
          paper=PAPER, method=METHOD, instrument=INSTRUMENT, applicable=_predates, key=S.sense_margin),
)

# the precision the headline is reported to (issue #38, studies.core.precision): the default sample is the smallest
# size of the curve (sample, value, 95% low, high on smollm2-135m; docs/sample_sizes.md) of at least min_sample (10
# resampling units) whose interval reached it
PRECISION = Precision(
    "kNN sense accuracy at a held-out layer − sense-blind baseline", "accuracy points",
    h.summary(S.sense_margin),
    h.summary(S.sense_margin_low),
    h.summary(S.sense_margin_high),
    half_width=0.05, knob="max_lemmas", default=100, scales=True, min_sample=10,
    curve=((50, 0.1169, 0.06015, 0.1737),
           (100, 0.1423, 0.09203, 0.1893),),
    command=CURVE_COMMAND,
    note='the sample is lemmas (WordNet words with two or more senses), not tokens; 50 lemmas did not reach ±0.05 (±0.057): the default stays 100')
