"""What the context memory study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from lens.text.token_classes import TOKEN_CLASSES
from studies import headlines as h
from studies import sample_size
from studies.contract import Claim, Headline, Names, ResultSpec, Rule, array, metric, scalar

M = Names(
    metric("all", "context memory of all probe tokens: held-out R² of the previous tokens' embeddings",
           title='context memory, all tokens', unit='held-out R²'),
    metric("all_gain", "all − the embedding baseline",
           title='context memory over the embedding baseline', unit='held-out R²'),
    *(metric(c, f"context memory of {c} tokens", title=f"context memory, {c} tokens", unit="held-out R²")
      for c in TOKEN_CLASSES),
    metric("corr_nonlinearity", "Spearman ρ between context memory at l and nonlinearity l → l+1 (None at the last)",
           title='correlation with nonlinearity l → l+1', unit='Spearman ρ'),
)
S = Names(
    *sample_size.SCALARS,
    scalar("k", "previous tokens read back", title='previous tokens read back', unit='tokens'),
    scalar("top_class", "the class with the most context memory (mean over layers)",
           title='class with the most context memory'),
    scalar("class_ranking", "classes by mean context memory", title='classes by context memory'),
    scalar("top_class_gain", "the class with the most memory over the embedding baseline",
           title='class with the most memory over baseline'),
    scalar("class_ranking_gain", "classes by mean gain over the baseline", title='classes by gain over baseline'),
    scalar("embed_baseline", "class -> the baseline probe's score on the token's own embedding",
           title='embedding baseline per class', unit='held-out R²'),
    scalar("embed_baseline_all", "the baseline over all probe tokens",
           title='embedding baseline, all tokens', unit='held-out R²'),
    scalar("class_counts", "class -> held-out tokens", title='held-out tokens per class', unit='tokens'),
    scalar("n_probe_tokens", "tokens sampled for the probe", title='probe tokens', unit='tokens'),
    scalar("n_test_tokens", "held-out tokens scored", title='held-out tokens', unit='tokens'),
    scalar("split_unit", "what the split keeps together: doc or window", title='split unit'),
    scalar("norm", "the fresh norm before the probe: rms, layer or None", title='fresh norm'),
    scalar("norm_source", "why that norm: the model card's final norm, a fallback, or the config",
           title='why that norm'),
    scalar("corr_with_nonlinearity", "corr_nonlinearity averaged over layers",
           title='correlation with nonlinearity, mean over layers', unit='Spearman ρ'),
)
A = Names(
    array("layers", "layer", "layer ids"),
    array("token_scores", "layer token", "per-token context memory (NaN where no predecessor)",
          title='context memory per token', unit='held-out R²'),
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
CLAIMS = (
    Claim("class with the most context memory", "filler tokens (punctuation, determiners, stop words) carry the "
          "most context", "LLM-Microscope (Razzhigaev et al. 2025)", h.summary(S.top_class),
          Rule("agrees when the top class is punctuation, determiner or stopword; else contradicts",
               agrees_in=frozenset({"punctuation", "determiner", "stopword"}))),
    Claim("correlation of context memory with nonlinearity", "tokens that hold more context are more nonlinear",
          "LLM-Microscope (Razzhigaev et al. 2025)", h.summary(S.corr_with_nonlinearity),
          Rule("agrees > 0; else contradicts", agrees=(1e-12, None)), unit="Spearman ρ"),
)
