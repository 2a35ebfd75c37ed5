"""What the intrinsic dim study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.core.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.core.registry.declaration`)."""

from __future__ import annotations

from studies.reporting import headlines as h
from studies.core import stability
from studies.core.precision import CURVE_COMMAND, Precision
from studies.core.contract import Claim, Headline, Names, ResultSpec, Rule, array, metric, scalar

_ESTIMATES = {"twonn": "TwoNN", "mle": "MLE (Levina–Bickel)", "twonn_shuffled": "TwoNN on shuffled text"}
_PARTS = {"": "headline estimate (subset median, or all tokens without subsets)",
          "_low": "interval over the random subsets (level: config confidence, 0.9 by default), low",
          "_high": "interval over the random subsets, high", "_all": "estimate on all tokens (up to sample_tokens)"}
_PART_TITLES = {"": "", "_low": ", subset interval low", "_high": ", subset interval high", "_all": ", all tokens"}
#: the fewest sequences (points of the sequence-level cloud) the hunchback claim is judged on
MIN_SEQUENCES = 50
_SEQ = "sequence-level TwoNN (one point per window)"
M = Names(
    *(metric(key + part, f"{name}: {doc}", title=f"{name}{_PART_TITLES[part]}", unit="dimensions")
      for key, name in _ESTIMATES.items() for part, doc in _PARTS.items()),
    metric("seq_twonn", "TwoNN on the sequence-level cloud: one point per window (its last token's state, or the "
           "mean over its tokens: extra.seq_pooling), every window's ratio r2/r1 (geometry.id_hunchback)",
           title=_SEQ, unit="dimensions"),
    metric("seq_twonn_low", "95% bootstrap interval of seq_twonn resampling documents (windows when fewer than "
           "10), low", title=f"{_SEQ}, 95% interval low", unit="dimensions"),
    metric("seq_twonn_high", "95% bootstrap interval of seq_twonn, high", title=f"{_SEQ}, 95% interval high",
           unit="dimensions"),
    metric("seq_twonn_shuffled", "seq_twonn on the shuffled-text control", title=f"{_SEQ}, shuffled text",
           unit="dimensions"),
)
S = Names(
    scalar("twonn_max", "largest TwoNN estimate over layers", title='TwoNN, maximum', unit='dimensions'),
    scalar("twonn_peak_layer", "layer of the TwoNN maximum", title='layer of the TwoNN peak', unit='layer'),
    scalar("twonn_peak_relative_depth", "that layer's relative depth (0 = first, 1 = last)",
           title='relative depth of the TwoNN peak', unit='relative depth (0–1)'),
    scalar("mle_max", "largest MLE estimate over layers", title='MLE, maximum', unit='dimensions'),
    scalar("mle_peak_layer", "layer of the MLE maximum", title='layer of the MLE peak', unit='layer'),
    scalar("n_duplicates_max", "most duplicate token states dropped at one layer",
           title='duplicate states dropped, max', unit='tokens'),
    scalar("twonn_shuffled_max", "largest TwoNN estimate on shuffled text",
           title='TwoNN on shuffled text, maximum', unit='dimensions'),
    scalar("twonn_minus_shuffled_mean", "mean over layers of TwoNN(real) − TwoNN(shuffled)",
           title='TwoNN real − shuffled, mean', unit='dimensions'),
    scalar("seq_hunchback", "sequence-level TwoNN at the interior peak layer minus the higher of the first and "
           "last layers', cross-fitted: the peak layer chosen on a random half of the documents and read on the "
           "other half, both ways, averaged over splits (geometry.id_hunchback): > 0 when an interior peak beats "
           "both ends", title="sequence-level ID, interior peak − max(first, last)", unit="dimensions"),
    scalar("seq_hunchback_raw", "the same read on the full profile at its own interior maximum (optimistic: the "
           "highest of many noisy layers)", title="sequence-level ID, peak − max(first, last), uncorrected",
           unit="dimensions"),
    scalar("seq_hunchback_low", "95% bootstrap interval of seq_hunchback (documents resampled, the splits drawn "
           "again), low", title="sequence-level ID peak − ends, 95% low", unit="dimensions"),
    scalar("seq_hunchback_high", "95% bootstrap interval of seq_hunchback, high",
           title="sequence-level ID peak − ends, 95% high", unit="dimensions"),
    scalar("seq_peak_layer", "layer of the interior maximum of seq_twonn", title="sequence-level ID, peak layer",
           unit="layer"),
    scalar("seq_peak_relative_depth", "its relative depth (0 = first layer, 1 = last)",
           title="sequence-level ID peak, relative depth", unit="relative depth (0–1)"),
    scalar("seq_peak_support", "share of bootstrap replicates whose own interior maximum is at seq_peak_layer",
           title="sequence-level ID peak, bootstrap support", unit="share of replicates (0–1)"),
    scalar("seq_n_sequences", "points of the sequence-level cloud (windows)", title="sequences", unit="sequences"),
    scalar("seq_n_units", "units the sequence-level bootstrap resamples", title="sequence-level resampled units",
           unit="units"),
    scalar("seq_units", "what the sequence-level bootstrap resamples: doc (documents) or window",
           title="sequence-level resampled unit"),
    scalar("seq_pooling", "one point per window: last (its last token's state) or mean (over its tokens)",
           title="sequence point"),
    scalar("seq_n_sequences_shuffled", "points of the shuffled control's sequence-level cloud",
           title="sequences, shuffled text", unit="sequences"),
    *stability.SCALARS,
)
A = Names(
    array("layers", "layer", "layer ids"),
    array("twonn_replicates", "layer replicate", "TwoNN on each random subset"),
    array("mle_replicates", "layer replicate", "MLE on each random subset"),
    array("n_duplicates", "layer", "duplicate token states dropped"),
    array("twonn_shuffled_replicates", "layer replicate", "TwoNN on each subset of the shuffled text"),
    array("seq_hunchback_replicates", "replicate", "seq_hunchback in each bootstrap replicate"),
    array("seq_null", "permutation", "seq_hunchback(real) − seq_hunchback(shuffled) with the pooled sequences "
          "relabelled at random (the permutation null)"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A)
HEADLINES = (
        Headline("sequence-level ID, interior peak − max(first, last)", h.summary(S.seq_hunchback),
                 "> 0: a central high-ID phase above both ends (Cheng et al. 2025; Valeriani et al. 2023)"),
        Headline("sequence-level ID peak, relative depth", h.summary(S.seq_peak_relative_depth),
                 "the peak in the early-to-middle layers (Cheng et al. 2025, Fig. 1)"),
        Headline("TwoNN peak, relative depth (all tokens, ours)", h.argmax_depth(M.twonn),
                 "ours, not a paper's statistic: the cloud of every token"),
        Headline("TwoNN maximum (all tokens, ours)", h.metric_max(M.twonn), "tens, far below d_model"),
    )

_SOURCE = ("Cheng et al. 2025, 'Emergence of a high-dimensional abstraction phase in language transformers' "
           "(ICLR 2025, arXiv:2405.15471); Valeriani et al. 2023, 'The geometry of hidden representations of "
           "large transformer models' (NeurIPS 2023, arXiv:2302.00294)")
_PAPER = ("the ID profile across layers of a cloud of ONE POINT PER SEQUENCE, peaking in the interior above both "
          "ends. Cheng et al.: 'observing, across five pre-trained transformer-based LMs and three input datasets, a "
          "distinct phase characterized by high intrinsic dimensionality ... a central high-dimensionality phase' "
          "(abstract; ID against relative depth, Fig. 1); their code represents each sequence by its last token's "
          "hidden state at every layer, takes 10,000 sequences per random partition (5 partitions, the spread "
          "shown over them), estimates the ID with GRIDE (dadapy, return_id_scaling_gride) at a scale read off the "
          "ID-vs-scale plateau per model, and reports that the peak collapses on shuffled text. Valeriani et al. "
          "(protein LMs and iGPT): 'In the first layers, the data manifold expands, becoming high-dimensional, and "
          "then contracts significantly in the intermediate layers. In the last part of the model, the ID remains "
          "approximately constant or forms a second shallow peak' (abstract; TwoNN, their code's estimate() with a "
          "decimation block analysis), on one representation per sequence (averaged over its tokens as we read "
          "the paper; its methods section was not readable from this session's sources). Neither paper gives a "
          "number for the height of the peak: the claim is the shape")
_METHOD = ("one point per capture window (its last token's state for a causal model, as Cheng et al.'s code; the "
           "mean over its tokens for a non-causal one), up to max_sequences windows; TwoNN (Facco et al., linear "
           "fit, 10% of the largest ratios discarded) per layer of the site; statistic = ID at the interior peak "
           "layer − max(ID at the first layer, ID at the last), cross-fitted (the peak layer chosen on a random half "
           "of the documents, read on the other half, both ways, averaged over 32 splits: the peak chosen and read "
           "on one sample is optimistic, a flat profile of 30 noisy layers then 'agreed' in 2–4 of 20 draws); 95% "
           "interval: bootstrap of the sequences' TwoNN ratios resampling documents (windows when fewer than 10), "
           "paired across layers, the splits drawn again in each replicate; nested subsamples N/4, N/2, N of the "
           "documents; null: the statistic on the shuffled-text control, p-value of T(real) − T(shuffled) (each at "
           "its own peak) against random relabellings of the pooled sequences (add-one)")
_RULE = Rule("agrees when the whole 95% interval of ID(interior peak) − max(ID first, ID last) lies above 0 (an "
             "interior maximum beats both ends by more than its interval); undecided when the interval straddles "
             "0; contradicts when it lies below 0 (an end is at least as high as every interior layer)",
             agrees=(0.0, None))


def _seq_applicable(rec) -> str | None:
    n = rec.summary.get(S.seq_n_sequences)
    if n is None or rec.summary.get(S.seq_hunchback) is None:
        return ("no sequence-level cloud in this result (a result from before #37, fewer than 3 layers, or "
                "sequences=False)")
    if n < MIN_SEQUENCES:
        return (f"only {n} sequences (windows) in the sequence-level cloud; the hunchback is judged on at least "
                f"{MIN_SEQUENCES} (raise --max-tokens or lower --seq-len)")
    return None


CLAIMS = (
    Claim("sequence-level ID: interior peak − max(first, last layer)",
          "the intrinsic dimension of the sequence-level cloud peaks in the interior layers, above both the first "
          "and the last layer (a hunchback)", _SOURCE, h.summary(S.seq_hunchback), _RULE,
          low=h.summary(S.seq_hunchback_low), high=h.summary(S.seq_hunchback_high), unit="dimensions",
          paper=_PAPER, method=_METHOD,
          instrument="TwoNN, not the paper's GRIDE at a hand-picked scale; windows of the store's corpus, not "
                     "their datasets",
          applicable=_seq_applicable, key=S.seq_hunchback),
)

# the precision the headline is reported to (issue #38, studies.core.precision): the default sample is the smallest
# size of the curve (sample, value, 95% low, high on smollm2-135m; docs/sample_sizes.md) of at least min_sample (10
# resampling units) whose interval reached it
PRECISION = Precision(
    "sequence-level ID: interior peak − max(first, last layer)", "dimensions",
    h.summary(S.seq_hunchback),
    h.summary(S.seq_hunchback_low),
    h.summary(S.seq_hunchback_high),
    half_width=5.0, knob="max_tokens", default=20000, scales=False, min_sample=1280,
    curve=((20000, 0.8712, -3.661, 5.428),),
    command=CURVE_COMMAND,
    note="one point per window of the store: the headline's sample is the store's windows (--max-tokens), not sample_tokens (the all-token TwoNN cloud, ours and not judged)")
