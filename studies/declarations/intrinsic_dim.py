"""What the intrinsic dim study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import Claim, Headline, Names, ResultSpec, Rule, array, metric, scalar

_ESTIMATES = {"twonn": "TwoNN", "mle": "MLE (Levina–Bickel)", "twonn_shuffled": "TwoNN on shuffled text"}
_PARTS = {"": "headline estimate (subset median, or all tokens without subsets)", "_low": "interval, low",
          "_high": "interval, high", "_all": "estimate on all tokens (up to max_points)"}
_PART_TITLES = {"": "", "_low": ", 95% interval low", "_high": ", 95% interval high", "_all": ", all tokens"}
M = Names(*(metric(key + part, f"{name}: {doc}", title=f"{name}{_PART_TITLES[part]}", unit="dimensions")
            for key, name in _ESTIMATES.items() for part, doc in _PARTS.items()))
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
CLAIMS = (
    Claim("relative depth of the TwoNN peak", "intrinsic dimension peaks at mid depth (a hunchback)",
          "LLM-Microscope; geometry of token point clouds", h.argmax_depth(M.twonn),
          Rule("agrees in [0.2, 0.8] of the depth (mid); weaker in [0.1, 0.2) or (0.8, 0.9]; at either end contradicts",
               agrees=(0.2, 0.8), weaker=((0.1, 0.2), (0.8, 0.9))), unit="relative depth (0–1)"),
)
