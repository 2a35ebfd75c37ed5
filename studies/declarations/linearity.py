"""What the linearity study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import Headline, Names, ResultSpec, array, metric, scalar

M = Names(
    metric("linearity", "linearity score of the map l → l+1 (1 = exactly linear)"),
    metric("linearity_centered", "linearity of the update h_{l+1} − h_l"),
    metric("nonlinearity_mean", "mean per-token nonlinearity of l → l+1"),
    metric("nonlinearity__{}", "mean per-token nonlinearity of one token class (lens.text.token_classes)"),
)
S = Names(
    scalar("linearity_mean", "mean linearity over transitions"),
    scalar("linearity_min", "lowest linearity"),
    scalar("linearity_min_layer", "source layer of the lowest linearity"),
    scalar("linearity_centered_mean", "mean centred linearity"),
    scalar("class_nonlinearity", "token class -> mean nonlinearity over transitions"),
    scalar("class_counts", "token class -> tokens"),
    scalar("most_nonlinear_class", "the class with the largest mean nonlinearity"),
    scalar("top_nonlinear_tokens", "the token types with the largest mean nonlinearity"),
)
_TOKEN = "the analysed tokens' column of the store's token table"
A = Names(
    array("layers", "layer", "source layers"),
    array("nonlinearity", "layer token", "per-token nonlinearity of l → l+1"),
    array("token_index", "token", "store row of each analysed token"),
    array("token_class", "token", "token class (lens.text.token_classes)", label=True),
    *(array(c, "token", _TOKEN, label=True) for c in ("token", "token_id", "doc", "window", "pos")),
    array("class_keys", "class", "token classes present, in lens.text.token_classes order"),
    array("class_mean", "layer class", "mean nonlinearity per class"),
    array("class_count", "class", "tokens per class"),
    array("token_type_keys", "type", "token types seen at least min_token_count times"),
    array("token_type_mean", "layer type", "mean nonlinearity per token type"),
    array("token_type_count", "type", "tokens per type"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A, token_rows=A.token_index, token_text=A.token,
                      layer_axis="transition l → l+1 of resid_post")
HEADLINES = (
        Headline("mean linearity score l → l+1", h.summary(S.linearity_mean),
                 "≈ 0.99 (Razzhigaev et al. 2024, 'secretly linear')"),
        Headline("most nonlinear token class", h.summary(S.most_nonlinear_class),
                 "filler / punctuation tokens (LLM-Microscope)"),
    )
CLAIMS = ()
