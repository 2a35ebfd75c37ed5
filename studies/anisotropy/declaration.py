"""What the anisotropy study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.core.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.core.registry.declaration`)."""

from __future__ import annotations

from studies.reporting import headlines as h
from studies.core import stability
from studies.core.precision import CURVE_COMMAND, Precision
from studies.core.contract import Claim, Headline, Names, ResultSpec, Rule, array, metric, scalar

KEY = "mean_cosine_excess"  # the judged headline's key for its nested-subsample and null records (studies.core.stability)

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
    metric("mean_cosine_low", "mean cosine of random pairs, 95% interval low (bootstrap over documents, else windows)",
           title="mean cosine, 95% interval low", unit="cosine"),
    metric("mean_cosine_high", "mean cosine of random pairs, 95% interval high", title="mean cosine, 95% interval high",
           unit="cosine"),
    metric("mean_cosine_null_quantile", "the isotropic null's null_quantile quantile of the mean cosine at the "
           "same number of tokens (zero-mean Gaussian with the layer's per-dimension variances: geometry.nulls)",
           title="mean cosine under the isotropic null, upper quantile", unit="cosine"),
    metric("participation_ratio", "participation ratio (Σλ)²/Σλ² of the covariance, plain (biased low at small n)",
           title="participation ratio (plain)", unit="dimensions"),
    metric("participation_ratio_corrected", "participation ratio corrected for the number of tokens (Chun et al. "
           "2026, row correction: geometry.participation)", title="participation ratio (corrected)", unit="dimensions"),
    metric("sink_top_ratio", "the largest channel's max |x| over the layer's median |x| (massive activations, Sun et "
           "al. 2024; every position of the sink sample, the first included)",
           title="largest channel's max |x| / median |x|", unit="ratio"),
    metric("sink_top_channel", "the channel with the largest max |x|", title="largest channel", unit="channel index"),
    metric("sink_top_first_share", "share of that channel's ten largest |x| at window position 0",
           title="largest channel: share of its top values at position 0", unit="share (0–1)"),
    metric("first_position_attention", "share of attention the layer's heads give window position 0, mean over heads "
           "and over query positions ≥ 1 (lens.capturing.attention_sinks)",
           title="attention to the first position", unit="share of attention (0–1)"),
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
    scalar("mean_cosine_excess_min", "lowest over layers of the mean cosine minus the isotropic null's upper "
           "quantile (> 0: every layer above the null)", title="mean cosine over the isotropic null, lowest layer",
           unit="cosine"),
    scalar("mean_cosine_excess_low", "its 95% interval low (bootstrap over documents, else windows)",
           title="excess over the null, 95% interval low", unit="cosine"),
    scalar("mean_cosine_excess_high", "its 95% interval high", title="excess over the null, 95% interval high",
           unit="cosine"),
    scalar("mean_cosine_excess_min_layer", "the layer of the lowest excess", title="layer of the lowest excess",
           unit="layer"),
    scalar("n_units", "documents (or windows) the bootstrap resamples", title="units resampled", unit="units"),
    scalar("bootstrap_unit", "what the bootstrap resamples: doc (>= 10 documents) or window",
           title="unit resampled"),
    scalar("sink_tokens", "tokens (whole windows, every position) the sink table reads", title="tokens in the sink table",
           unit="tokens"),
    scalar("sink_top_ratio_max", "the largest max / median magnitude ratio over layers",
           title="massive activation: max / median, largest layer", unit="ratio"),
    scalar("sink_top_ratio_layer", "its layer", title="layer of the largest massive activation", unit="layer"),
    scalar("sink_top_ratio_channel", "its channel", title="channel of the largest massive activation",
           unit="channel index"),
    scalar("sink_attention", "'present: ...', or why the share of attention to the first position is absent",
           title="attention to the first position"),
    *stability.SCALARS,
)
A = Names(
    array("layers", "layer", "layer ids"),
    array("rogue_dims", "layer rank", "top dimensions by contribution to the mean cosine"),
    array("cosine_contributions", "layer d_model", "each dimension's contribution to the mean cosine"),
    array("outlier_magnitude_z", "layer d_model", "z-score of mean |x| across dimensions"),
    array("outlier_position_corr", "layer d_model", "correlation of each dimension with position"),
    array("outlier_extreme_share", "layer d_model", "share of tokens whose largest |x| is this dimension"),
    array("persistent_outlier_dims", "outlier", "dimensions that are outliers in most layers"),
    array("sink_channels", "layer rank", "per layer the channels with the largest max |x| (rank 0 the largest)"),
    array("sink_max_abs", "layer rank", "their max |x|", title="max |x|", unit="activation"),
    array("sink_ratio", "layer rank", "their max |x| over the layer's median |x|", title="max / median |x|",
          unit="ratio"),
    array("sink_position", "layer rank", "the window position of that max", label=True),
    array("sink_first_share", "layer rank", "share of the channel's ten largest |x| at position 0",
          title="share of top values at position 0", unit="share (0–1)"),
    array("sink_median_abs", "layer", "the layer's median |x| over every token and channel", title="median |x|",
          unit="activation"),
    array("first_position_attention_heads", "layer head", "share of attention each head gives position 0",
          title="attention to the first position", unit="share of attention (0–1)"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A)
HEADLINES = (
        Headline("max mean cosine of random pairs", h.metric_max(M.mean_cosine),
                 "high in middle/late layers (Ethayarajh 2019)"),
        Headline("max share of cosine in top-3 dims", h.metric_max(M.rogue_share),
                 "a few rogue dimensions dominate (Timkey & van Schijndel 2021)"),
        Headline("mean cosine over the isotropic null, lowest layer", h.summary(S.mean_cosine_excess_min),
                 "> 0 in every non-input layer; ≥ 0.136 in the paper's (Ethayarajh 2019)"),
    )
def _has_null(record) -> str | None:
    if record.summary.get(S.mean_cosine_excess_min) is None:
        return ("the result has no mean cosine against the isotropic null (mean_cosine_excess_min): it predates "
                "the null; rerun the study")
    return None


CLAIMS = (
    Claim("mean cosine of random pairs minus the isotropic null's 97.5% quantile, lowest over layers",
          "contextual representations are anisotropic in every (non-input) layer: random token pairs have a mean "
          "cosine clearly above what an isotropic distribution gives", "Ethayarajh 2019",
          h.summary(S.mean_cosine_excess_min),
          Rule("agrees: in every layer the mean cosine of random pairs lies above the isotropic null's 97.5% "
               "quantile by ≥ 0.1 (the paper's lowest non-input layer: 0.136, ELMo layer 2; BERT's lowest 0.168); "
               "weaker: above the null in every layer, but some layer by less than 0.1; contradicts: some layer "
               "below the null's quantile (as isotropic as the null); undecided: the interval holds 0 or 0.1",
               agrees=(0.1, None), weaker=((0.0, 0.1),)),
          low=h.summary(S.mean_cosine_excess_low), high=h.summary(S.mean_cosine_excess_high), unit="cosine",
          paper="the average cosine similarity between the representations of uniformly randomly sampled words "
                "(1 − cosine distance of random pairs), per layer; 0 for an isotropic (directionally uniform) "
                "layer. Ethayarajh 2019, §4.1, Fig. 1 ('not isotropic in any layer', abstract); the authors' "
                "released values (kawine/contextual, embedding_space_stats.json): GPT-2 layers 1–12 0.57–0.98 "
                "(0.978 at layer 12), BERT layers 1–12 0.17–0.68, ELMo layers 1–2 0.157, 0.136; input layers 0.611 "
                "(GPT-2), 0.105 (BERT), 0.008 (ELMo)",
          method="per layer of the study's site (every block's output: all non-input layers), the mean cosine over "
                 "all distinct pairs of the analysed tokens (closed form from the sum of unit rows), minus the "
                 "97.5% quantile of the same statistic at the same number of tokens under the isotropic null: a "
                 "zero-mean Gaussian with the layer's per-dimension variances and no correlation (it removes the "
                 "shared direction and correlations, the 'cone', and keeps unequal dimension spreads; a "
                 "per-dimension permutation would keep each dimension's mean, hence the cone: geometry.nulls). "
                 "Tokens: the study's (special tokens and position 0 left out for the massive first-position "
                 "activations; cosine ignores norms, and position 0 takes part in about 2/seq_len of the pairs). "
                 "The lowest excess over layers is judged (the claim is about every layer); 95% interval: "
                 "percentile bootstrap over documents (windows when fewer than 10), every layer resampled "
                 "together; null p: the same lowest-excess statistic on the null's draws (add-one)",
          applicable=_has_null, key=KEY),
)

# the precision the headline is reported to (issue #38, studies.core.precision): the default sample is the smallest
# size of the curve (sample, value, 95% low, high on smollm2-135m; docs/sample_sizes.md) of at least min_sample (10
# resampling units) whose interval reached it
PRECISION = Precision(
    "mean cosine of random pairs over the isotropic null, lowest layer", "cosine",
    h.summary(S.mean_cosine_excess_min),
    h.summary(S.mean_cosine_excess_low),
    h.summary(S.mean_cosine_excess_high),
    half_width=0.01, knob="sample_tokens", default=2500, scales=True, min_sample=1280, missed=(1280,),
    curve=((1280, 0.2377, 0.2304, 0.2444),
           (2500, 0.2356, 0.2315, 0.2399),
           (5000, 0.2353, 0.2317, 0.2388),
           (19840, 0.2351, 0.2325, 0.2378),),
    command=CURVE_COMMAND,
    note="re-checked on a 4000-token store of SmolLM2 (seed 0): 1280 tokens gave ±0.018 (±0.007 on the main job's store), 2500 gave ±0.009: the default is 2500")
