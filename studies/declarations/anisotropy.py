"""What the anisotropy study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import Headline, Names, ResultSpec, array, metric, scalar

_SCALARS = {  # geometry.AnisotropyProfile field -> what it is
    "mean_cosine": "mean cosine of random token pairs",
    "top_pc_share": "variance share of the top principal component",
    "top_pc_share_adjusted": "top_pc_share minus its baseline",
    "self_similarity": "mean cosine between contexts of one word type (token id)",
    "self_similarity_adjusted": "self_similarity minus its baseline",
    "intra_sentence_similarity": "mean cosine of a token to its window's mean",
    "intra_sentence_similarity_adjusted": "intra_sentence_similarity minus its baseline",
    "mev": "maximum explainable variance of a word type's contexts",
    "mev_adjusted": "mev minus its baseline",
    "rogue_share": "share of the mean cosine carried by the top k_rogue dimensions",
}
M = Names(
    *(metric(k, doc) for k, doc in _SCALARS.items()),
    metric("rogue_dims", "the top k_rogue dimensions by contribution to the mean cosine (a list per layer)"),
    metric("position0_norm_ratio", "mean norm of the left-out first-position tokens over the others"),
    metric("n_outlier_dims", "dimensions whose mean |x| has z-score above outlier_z"),
    metric("outlier_position_corr", "largest |correlation with position| among the outlier dimensions"),
    metric("{}__{}", "<metric> under <post-processing> (geometry.POSTPROCESSING)", attr="postprocessed"),
)
S = Names(
    scalar("max_mean_cosine", "largest mean cosine over layers"),
    scalar("max_mean_cosine_layer", "its layer"),
    scalar("mean_rogue_share", "rogue_share averaged over layers"),
    scalar("persistent_outlier_dims", "dimensions that are outliers in most layers"),
    scalar("persistent_outlier_position_corr", "their mean |correlation with position|"),
    scalar("mean_cosine_mean__{}", "mean cosine averaged over layers, under each post-processing",
           attr="mean_cosine_mean"),
)
A = Names(
    array("layers", "layer", "layer ids"),
    array("rogue_dims", "layer rank", "top dimensions by contribution to the mean cosine"),
    array("cosine_contributions", "layer d_model", "each dimension's contribution to the mean cosine"),
    array("outlier_magnitude_z", "layer d_model", "z-score of mean |x| across dimensions"),
    array("outlier_position_corr", "layer d_model", "correlation of each dimension with position"),
    array("outlier_extreme_share", "layer d_model", "share of tokens whose largest |x| is this dimension"),
    array("persistent_outlier_dims", "outlier", "dimensions that are outliers in most layers"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A)
HEADLINES = (
        Headline("max mean cosine of random pairs", h.metric_max(M.mean_cosine),
                 "high in middle/late layers (Ethayarajh 2019)"),
        Headline("max share of cosine in top-3 dims", h.metric_max(M.rogue_share),
                 "a few rogue dimensions dominate (Timkey & van Schijndel 2021)"),
    )
CLAIMS = ()
