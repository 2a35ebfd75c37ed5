"""What the context memory study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from lens.text.token_classes import TOKEN_CLASSES
from studies import headlines as h
from studies.contract import Headline, Names, ResultSpec, array, metric, scalar

M = Names(
    metric("all", "context memory of all probe tokens: held-out R² of the previous tokens' embeddings"),
    metric("all_gain", "all − the embedding baseline"),
    *(metric(c, f"context memory of {c} tokens") for c in TOKEN_CLASSES),
    metric("corr_nonlinearity", "Spearman ρ between context memory at l and nonlinearity l → l+1 (None at the last)"),
)
S = Names(
    scalar("k", "previous tokens read back"),
    scalar("top_class", "the class with the most context memory (mean over layers)"),
    scalar("class_ranking", "classes by mean context memory"),
    scalar("top_class_gain", "the class with the most memory over the embedding baseline"),
    scalar("class_ranking_gain", "classes by mean gain over the baseline"),
    scalar("embed_baseline", "class -> the baseline probe's score on the token's own embedding"),
    scalar("embed_baseline_all", "the baseline over all probe tokens"),
    scalar("class_counts", "class -> held-out tokens"),
    scalar("n_probe_tokens", "tokens sampled for the probe"),
    scalar("n_test_tokens", "held-out tokens scored"),
    scalar("split_unit", "what the split keeps together: doc or window"),
    scalar("norm", "the fresh norm before the probe: rms, layer or None"),
    scalar("norm_source", "why that norm: the model card's final norm, a fallback, or the config"),
    scalar("corr_with_nonlinearity", "corr_nonlinearity averaged over layers"),
)
A = Names(
    array("layers", "layer", "layer ids"),
    array("token_scores", "layer token", "per-token context memory (NaN where no predecessor)"),
    array("test_rows", "token", "store rows of the held-out tokens"),
    array("token_class", "token", "token class of each held-out token", label=True),
    array("score_by_offset", "layer offset", "held-out R² per predecessor offset 1..k"),
    array("classes", "class", "token classes present"),
    array("by_class", "layer class", "context memory per class"),
    array("embed_token_scores", "token", "baseline per-token scores"),
    array("gain_by_class", "layer class", "by_class − the baseline per class"),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A, token_rows=A.test_rows)
HEADLINES = (
        Headline("class with most context memory", h.summary(S.top_class),
                 "fillers: punctuation, determiners (LLM-Microscope)"),
        Headline("correlation with nonlinearity", h.summary(S.corr_with_nonlinearity), "positive (LLM-Microscope)"),
    )
CLAIMS = ()
