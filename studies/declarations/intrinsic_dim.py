"""What the intrinsic dim study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import Headline, Names, ResultSpec, array, metric, scalar

_ESTIMATES = {"twonn": "TwoNN", "mle": "MLE (Levina–Bickel)", "twonn_shuffled": "TwoNN on shuffled text"}
_PARTS = {"": "headline estimate (subset median, or all tokens without subsets)", "_low": "interval, low",
          "_high": "interval, high", "_all": "estimate on all tokens (up to max_points)"}
M = Names(*(metric(key + part, f"{name}: {doc}") for key, name in _ESTIMATES.items() for part, doc in _PARTS.items()))
S = Names(
    scalar("twonn_max", "largest TwoNN estimate over layers"),
    scalar("twonn_peak_layer", "layer of the TwoNN maximum"),
    scalar("twonn_peak_relative_depth", "that layer's relative depth (0 = first, 1 = last)"),
    scalar("mle_max", "largest MLE estimate over layers"),
    scalar("mle_peak_layer", "layer of the MLE maximum"),
    scalar("n_duplicates_max", "most duplicate token states dropped at one layer"),
    scalar("twonn_shuffled_max", "largest TwoNN estimate on shuffled text"),
    scalar("twonn_minus_shuffled_mean", "mean over layers of TwoNN(real) − TwoNN(shuffled)"),
)
A = Names(
    array("layers", "layer", "layer ids"),
    array("twonn_replicates", "layer replicate", "TwoNN on each random subset"),
    array("mle_replicates", "layer replicate", "MLE on each random subset"),
    array("n_duplicates", "layer", "duplicate token states dropped"),
    array("twonn_shuffled_replicates", "layer replicate", "TwoNN on each subset of the shuffled text"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A)
HEADLINES = (
        Headline("TwoNN peak, relative depth", h.argmax_depth(M.twonn),
                 "ID peaks at mid depth (LLM-Microscope; token point clouds)"),
        Headline("TwoNN maximum", h.metric_max(M.twonn), "tens, far below d_model"),
    )
CLAIMS = ()
