"""What the anisotropy study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import Claim, Headline, Names, ResultSpec, Rule, array, metric, scalar

_SCALARS = {  # geometry.AnisotropyProfile field -> what it is
    "mean_cosine": "mean cosine of random token pairs",
    "top_pc_share": "variance share of the top principal component",
    "top_pc_share_adjusted": "top_pc_share minus its baseline",
    "self_similarity": "mean cosine between contexts of one word type (token id)",
    "self_similarity_adjusted": "self_similarity minus its baseline",
    "intra_sentence_similarity": "mean cosine of a token to its window's mean",
    "intra_sentence_similarity_adjusted": "intra_sentence_similarity minus its baseline",
    "mev": "maximum explainable variance of a word type's contexts, uncentred (the paper's definition)",
    "mev_adjusted": "mev minus its baseline",
    "mev_centred": "maximum explainable variance of a word type's centred contexts (the paper's code: a PCA)",
    "mev_centred_adjusted": "mev_centred minus its baseline",
    "rogue_share": "share of the mean cosine carried by the top k_rogue dimensions",
}
_LABELS = {  # name -> (title, unit)
    "mean_cosine": ("mean cosine of random pairs", "cosine"),
    "top_pc_share": ("top principal component's variance share", "share of variance (0–1)"),
    "top_pc_share_adjusted": ("top-PC share over baseline", "share of variance"),
    "self_similarity": ("self-similarity of a word type", "cosine"),
    "self_similarity_adjusted": ("self-similarity over baseline", "cosine"),
    "intra_sentence_similarity": ("intra-sentence similarity", "cosine"),
    "intra_sentence_similarity_adjusted": ("intra-sentence similarity over baseline", "cosine"),
    "mev": ("maximum explainable variance (uncentred)", "share of variance (0–1)"),
    "mev_adjusted": ("maximum explainable variance (uncentred) over baseline", "share of variance"),
    "mev_centred": ("maximum explainable variance (centred)", "share of variance (0–1)"),
    "mev_centred_adjusted": ("maximum explainable variance (centred) over baseline", "share of variance"),
    "rogue_share": ("share of the mean cosine in the top dimensions", "share of the cosine (0–1)"),
}
M = Names(
    *(metric(k, doc, title=_LABELS[k][0], unit=_LABELS[k][1]) for k, doc in _SCALARS.items()),
    metric("rogue_dims", "the top k_rogue dimensions by contribution to the mean cosine (a list per layer)",
           title='rogue dimensions', unit='dimension indices'),
    metric("position0_norm_ratio", "mean norm of the left-out first-position tokens over the others",
           title='norm of first-position tokens / others', unit='ratio'),
    metric("n_outlier_dims", "dimensions whose mean |x| has z-score above outlier_z",
           title='outlier dimensions', unit='dimensions'),
    metric("outlier_position_corr", "largest |correlation with position| among the outlier dimensions",
           title="outliers' largest |correlation with position|", unit='|Pearson r|'),
    metric("{}__{}", "<metric> under <post-processing> (geometry.POSTPROCESSING)", attr="postprocessed",
           title="{} after {}", unit="as the metric"),
)
S = Names(
    scalar("max_mean_cosine", "largest mean cosine over layers", title='mean cosine, max over layers', unit='cosine'),
    scalar("max_mean_cosine_layer", "its layer", title='layer of the max mean cosine', unit='layer'),
    scalar("mean_rogue_share", "rogue_share averaged over layers",
           title='rogue share, mean over layers', unit='share of the cosine (0–1)'),
    scalar("persistent_outlier_dims", "dimensions that are outliers in most layers",
           title='persistent outlier dimensions', unit='dimension indices'),
    scalar("persistent_outlier_position_corr", "their mean |correlation with position|",
           title='their mean |correlation with position|', unit='|Pearson r|'),
    scalar("mean_cosine_mean__{}", "mean cosine averaged over layers, under each post-processing",
           attr="mean_cosine_mean", title="mean cosine, mean over layers, after {}", unit="cosine"),
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
CLAIMS = (
    Claim("mean cosine of random pairs, max over layers", "contextual representations are anisotropic: random "
          "token pairs have a high cosine in upper layers", "Ethayarajh 2019", h.metric_max(M.mean_cosine),
          Rule("agrees ≥ 0.5 (clearly anisotropic); weaker in (0.1, 0.5); ≤ 0.1 (near isotropic) contradicts",
               agrees=(0.5, None), weaker=((0.1, 0.5),)), unit="cosine"),
)
