"""What the linearity study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.core.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.core.registry.declaration`)."""

from __future__ import annotations

from studies.reporting import headlines as h
from studies.core import stability
from studies.core.precision import CURVE_COMMAND, Precision
from studies.core.contract import AxisKind, Claim, Headline, LayerAxis, Names, ResultSpec, Rule, array, metric, scalar

KEY = "linearity_mean"  # the judged headline's key for its nested-subsample and null records (studies.core.stability)

M = Names(
    metric("linearity", "linearity score of the map l → l+1 (1 = exactly linear)",
           title='linearity score l → l+1', unit='score (1 = linear)'),
    metric("linearity_centered", "linearity of the update h_{l+1} − h_l",
           title='linearity of the update h(l+1) − h(l)', unit='score (1 = linear)'),
    metric("nonlinearity_mean", "mean per-token nonlinearity of l → l+1",
           title='per-token nonlinearity, mean', unit='residual norm (0–1)'),
    metric("nonlinearity__{}", "mean per-token nonlinearity of one token class (lens.text.token_classes)",
           title="nonlinearity, {} tokens", unit="residual norm (0–1)"),
    metric("linearity_sink_free", "linearity score l → l+1 without special tokens and position 0 (the attention "
           "sink's massive activations)", title="linearity score l → l+1, sink-free", unit="score (1 = linear)"),
)
S = Names(
    scalar("linearity_mean", "mean linearity over transitions",
           title='linearity, mean over transitions', unit='score (1 = linear)'),
    scalar("linearity_min", "lowest linearity", title='linearity, lowest', unit='score (1 = linear)'),
    scalar("linearity_min_layer", "source layer of the lowest linearity",
           title='source layer of the lowest linearity', unit='layer'),
    scalar("linearity_centered_mean", "mean centred linearity",
           title='centred linearity, mean', unit='score (1 = linear)'),
    scalar("linearity_mean_low", "linearity_mean, 95% interval low (bootstrap over documents, else windows, with "
           "each transition's fitted map held fixed)", title="linearity, mean: 95% interval low",
           unit="score (1 = linear)"),
    scalar("linearity_mean_high", "linearity_mean, 95% interval high", title="linearity, mean: 95% interval high",
           unit="score (1 = linear)"),
    scalar("linearity_mean_large_n", "intercept a of linearity_mean ≈ a + b/n through the nested subsamples: where "
           "the in-sample score heads with more tokens (its fit's optimism falls as 1/n); not judged",
           title="linearity, mean: extrapolated to many tokens", unit="score (1 = linear)"),
    scalar("linearity_sink_free_mean", "mean over transitions of the sink-free linearity (no special token, no "
           "position 0)", title="linearity, mean, sink-free", unit="score (1 = linear)"),
    scalar("linearity_sink_free_min", "lowest sink-free linearity", title="linearity, lowest, sink-free",
           unit="score (1 = linear)"),
    scalar("sink_free_tokens", "tokens the sink-free score is fitted on", title="tokens, sink-free", unit="tokens"),
    scalar("n_units", "documents (or windows) the bootstrap resamples", title="units resampled", unit="units"),
    scalar("bootstrap_unit", "what the bootstrap resamples: doc (>= 10 documents) or window",
           title="unit resampled"),
    *stability.SCALARS,
    scalar("class_nonlinearity", "token class -> mean nonlinearity over transitions",
           title='nonlinearity per token class', unit='residual norm (0–1)'),
    scalar("class_counts", "token class -> tokens", title='tokens per class', unit='tokens'),
    scalar("most_nonlinear_class", "the class with the largest mean nonlinearity",
           title='most nonlinear token class'),
    scalar("top_nonlinear_tokens", "the token types with the largest mean nonlinearity",
           title='most nonlinear token types'),
)
_TOKEN = "the analysed tokens' column of the store's token table"
A = Names(
    array("layers", "layer", "source layers"),
    array("nonlinearity", "layer token", "per-token nonlinearity of l → l+1",
          title='per-token nonlinearity l → l+1', unit='residual norm (0–1)'),
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
                      layer_axis=LayerAxis(AxisKind.TRANSITION, "resid_post"))
def _token_set(record) -> str | None:
    """Why a result cannot be judged against the paper: scored without position 0 or the special tokens (the
    paper keeps every token, its BOS and the first position included)."""
    cfg = record.config or {}
    skip = cfg.get("skip_first", cfg.get("min_pos", 0))  # min_pos: its name before the shared filter (issue #40)
    left_out = [what for what, gone in (("position 0", int(skip or 0) > 0),
                                        ("special tokens (BOS)", bool(cfg.get("drop_special", False)))) if gone]
    if left_out:
        return (f"scored without {' and '.join(left_out)}, not the paper's token set (every token, BOS and position 0 "
                f"included): rerun with skip_first=0 and drop_special=false (the defaults)")
    return None


HEADLINES = (
        Headline("mean linearity score l → l+1", h.summary(S.linearity_mean),
                 "≈ 0.99 (Razzhigaev et al. 2024, 'secretly linear')"),
        Headline("mean linearity score l → l+1, sink-free (no position 0)", h.summary(S.linearity_sink_free_mean),
                 "not the paper's token set: position 0 / BOS left out"),
        Headline("most nonlinear token class", h.summary(S.most_nonlinear_class),
                 "filler / punctuation tokens (LLM-Microscope)"),
    )
CLAIMS = (
    Claim("mean linearity score l → l+1", "the map between consecutive layers is almost linear (≈ 0.99)",
          "Your Transformer is Secretly Linear (Razzhigaev et al. 2024)", h.summary(S.linearity_mean),
          Rule("agrees ≥ 0.98; weaker in [0.9, 0.98); else contradicts", agrees=(0.98, None), weaker=((0.9, 0.98),)),
          low=h.summary(S.linearity_mean_low), high=h.summary(S.linearity_mean_high),
          unit="score (1 = linear)",
          paper="the linearity score 1 − ‖X̃A − Ỹ‖²_F of consecutive layers' token embeddings, each centred and "
                "scaled to unit Frobenius norm, A the least-squares map fitted in sample; ≈ 0.99 between "
                "consecutive layers of GPT, LLaMA, OPT, BLOOM decoders (abstract: 'Procrustes similarity score of "
                "0.99'; per-layer profiles, Fig. 1). Tokens: every token of 512-character enwik8 chunks as the "
                "tokenizer returns them, its BOS and position 0 included (the authors' LLM-Microscope notebook: "
                "tokenizer(text), every hidden state's rows)",
          method="the same score (geometry.linearity: centring, Frobenius normalisation, in-sample least squares) "
                 "for each transition block l → l+1 of the study's site, averaged over transitions (the paper's "
                 "pairs start at the embeddings; ours at block 0), on every analysed token — special tokens and "
                 "position 0 included, as the paper; the sink-free score without them is reported beside it. "
                 "95% interval: percentile bootstrap over documents (windows when fewer than 10) with each "
                 "transition's fitted map held fixed (the map's own sampling error is not in it; the nested "
                 "subsamples, refitted, show how the in-sample fit moves with n; a + b/n through them, "
                 "linearity_mean_large_n, says where it heads). Null: permuted pairings (token i "
                 "at layer l with a random token at l+1) on the weakest transition, scored the same way "
                 "(expectation rank/(n − 1)); p of the weakest transition, conservative for the mean",
          applicable=_token_set, key=KEY),
)

# the precision the headline is reported to (issue #38, studies.core.precision): the default sample is the smallest
# size of the curve (sample, value, 95% low, high on smollm2-135m; docs/sample_sizes.md) of at least min_sample (10
# resampling units) whose interval reached it
PRECISION = Precision(
    "mean linearity score l → l+1", "score (0–1)",
    h.summary(S.linearity_mean),
    h.summary(S.linearity_mean_low),
    h.summary(S.linearity_mean_high),
    half_width=0.001, knob="sample_tokens", default=50000, scales=True, min_sample=1280,
    curve=((50000, 0.978, 0.9774, 0.9785),),
    command=CURVE_COMMAND,
    note="the rule's threshold (0.98) lies a thousandth from the value on SmolLM2: the study reads every token of the main job's store")
