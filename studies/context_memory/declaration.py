"""What the context memory study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.core.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.core.registry.declaration`)."""

from __future__ import annotations

from lens.text.token_classes import TOKEN_CLASSES
from studies.reporting import headlines as h
from studies.core import stability
from studies.core.precision import CURVE_COMMAND, Precision
from studies.core.contract import Claim, Headline, Names, ResultSpec, Rule, array, interval_scalars, metric, scalar

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
    *stability.SCALARS,
    scalar("k", "previous tokens read back", title='previous tokens read back', unit='tokens'),
    scalar("top_class", "the class with the most raw context memory (mean over layers; identity not removed)",
           title='class with the most raw context memory'),
    scalar("class_ranking", "classes by mean raw context memory", title='classes by raw context memory'),
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
    scalar("n_test_units", "held-out documents (or windows) the intervals resample", title='held-out units',
           unit='units'),
    scalar("boot_unit", "what the intervals resample: doc, or window when fewer than min_docs documents are "
                        "held out", title='bootstrap unit'),
    *interval_scalars("filler_margin_gain", "the best filler class's mean memory gain over the identity baseline "
                      "minus the best other class's (a token's gain: its score averaged over layers minus its "
                      "own-embedding baseline); > 0: a filler class holds the most",
                      title="filler margin of memory over baseline", unit="held-out R²",
                      how="over held-out units"),
    *interval_scalars("corr_gain_nonlinearity", "Spearman ρ over held-out tokens between the memory gain (pooled "
                      "over layers) and the nonlinearity averaged over transitions",
                      title="correlation of memory gain with nonlinearity", unit="Spearman ρ",
                      how="over held-out units"),
    scalar("split_unit", "what the split keeps together: doc or window", title='split unit'),
    scalar("norm", "the fresh norm before the probe: rms, layer or None", title='fresh norm'),
    scalar("norm_source", "why that norm: the model card's final norm, a fallback, or the config",
           title='why that norm'),
    scalar("corr_with_nonlinearity", "corr_nonlinearity (raw scores, per layer) averaged over layers",
           title='correlation of raw memory with nonlinearity, mean over layers', unit='Spearman ρ'),
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
    array("token_gain", "token", "per held-out token: score averaged over layers − its baseline score",
          title='context memory over the identity baseline', unit='held-out R²'),
)

RESULT = ResultSpec(metrics=M, summary=S, arrays=A, token_rows=A.test_rows)
INSTRUMENT = ("with a linear k-token probe, not the paper's decoder: a ridge map per layer reads back the input "
              "embeddings of the previous k tokens, scored over the token's own-embedding baseline")
FILLER_RULE = Rule("agrees > 0: a filler class (punctuation, determiner, stop word) holds the most memory over the "
                   "identity baseline; contradicts ≤ 0: another class holds more",
                   agrees=(1e-12, None))
#: the paper calls the correlation strong; 0.5 is Cohen's (1988) large correlation
STRONG = 0.5
CORR_RULE = Rule(f"agrees ≥ {STRONG} (a strong correlation, Cohen's large effect); weaker in (0, {STRONG}): "
                 "the paper's sign, not its strength; contradicts ≤ 0",
                 agrees=(STRONG, None), weaker=((1e-12, STRONG),))

HEADLINES = (
        Headline("class with most memory over the identity baseline", h.summary(S.top_class_gain),
                 "fillers: punctuation, determiners (LLM-Microscope)"),
        Headline("filler margin of memory over baseline", h.summary(S.filler_margin_gain),
                 "> 0: a filler class holds the most (LLM-Microscope)"),
        Headline("correlation of memory gain with nonlinearity", h.summary(S.corr_gain_nonlinearity),
                 "strong, positive (LLM-Microscope)"),
        Headline("class with most raw context memory (identity not removed)", h.summary(S.top_class),
                 "ours: the raw score, not judged"),
    )
CLAIMS = (
    Claim("filler class with the most context memory", "filler tokens (punctuation, determiners, stop words) carry "
          "the most context", "LLM-Microscope (Razzhigaev et al. 2025)", h.summary(S.filler_margin_gain),
          FILLER_RULE, low=h.summary(S.filler_margin_gain_low), high=h.summary(S.filler_margin_gain_high),
          unit="held-out R²",
          paper="per-token contextualization C_i = −log P(w_1 … w_{i−1} | e_i): a decoder (a learned pooling of "
                "every layer's state, an MLP and a copy of the model) is trained to reconstruct the token's prefix, "
                "and its loss is averaged per token class; determiners, punctuation and stop words reconstruct "
                "their prefix best (Razzhigaev et al. 2025, LLM-Microscope, their contextual-memory analysis)",
          method="ridge probe per layer from each held-out token's state to the input embeddings of its previous "
                 "k tokens (held-out R²), averaged over layers, minus the same probe on the token's own input "
                 "embedding (what its identity alone predicts of its prefix); per class the mean of that gain; "
                 "the value: the best filler class's mean minus the best other class's. 95% interval: bootstrap "
                 "over held-out documents (their windows when fewer than 10 are held out), the probes held "
                 "fixed; nested: both probes fitted again on a quarter and a half of the units",
          instrument=INSTRUMENT, key=S.filler_margin_gain),
    Claim("correlation of context memory with nonlinearity", "tokens that hold more context are more nonlinear",
          "LLM-Microscope (Razzhigaev et al. 2025)", h.summary(S.corr_gain_nonlinearity), CORR_RULE,
          low=h.summary(S.corr_gain_nonlinearity_low), high=h.summary(S.corr_gain_nonlinearity_high),
          unit="Spearman ρ",
          paper="a correlation over tokens between a token's contextualization (its decoder's prefix-"
                "reconstruction score, one per token from every layer pooled) and its nonlinearity "
                "E_i^l = ‖A* h_i^l − h_i^{l+1}‖ "
                "(A* the least-squares map between consecutive layers), which the paper calls strong (Razzhigaev "
                "et al. 2025, abstract: 'a strong correlation between contextualization and linearity'); the sign "
                "is read as more context with more nonlinearity",
          method="Spearman ρ over held-out tokens between the identity-corrected memory gain (score averaged over "
                 "layers minus the own-embedding baseline) and the token's nonlinearity averaged over transitions "
                 "(geometry.token_nonlinearity, A fitted on every probe token). 95% interval: bootstrap over "
                 "held-out documents (their windows when fewer than 10); nested: the probes fitted again on a "
                 "quarter and a half of the units",
          instrument=INSTRUMENT, key=S.corr_gain_nonlinearity),
)

# the precision the headline is reported to (issue #38, studies.core.precision): the default sample is the smallest
# size of the curve (sample, value, 95% low, high on smollm2-135m; docs/sample_sizes.md) of at least min_sample (10
# resampling units) whose interval reached it
PRECISION = Precision(
    "filler margin of memory over the identity baseline", "accuracy points",
    h.summary(S.filler_margin_gain),
    h.summary(S.filler_margin_gain_low),
    h.summary(S.filler_margin_gain_high),
    half_width=0.05, knob="sample_tokens", default=4000, scales=True, min_sample=1280,
    curve=((1000, -0.02724, -0.02944, -0.0074),
           (2000, -0.05124, -0.09462, -0.02185),
           (4000, -0.09064, -0.1166, -0.06868),),
    command=CURVE_COMMAND,
    note='kept at 4000: the interval resamples the held-out fifth of the windows, 7 of them at 4000 and 3 at 2000, fewer than the ten units a trusted interval needs already at 4000 — so the sample is not cut (2000 reached ±0.036 on 3 units, not an interval to trust)')
