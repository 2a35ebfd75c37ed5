"""What the linearity study declares, as plain data: its result names with labels and units, its
layer axis, headlines and judged claims (:mod:`studies.contract`). Imports no torch and no compute code:
the explorer and the report read it without loading the study (:func:`studies.registry.declaration`)."""

from __future__ import annotations

from studies import headlines as h
from studies.contract import AxisKind, Claim, Headline, LayerAxis, Names, ResultSpec, Rule, array, metric, scalar

M = Names(
    metric("linearity", "linearity score of the map l → l+1 (1 = exactly linear)",
           title='linearity score l → l+1', unit='score (1 = linear)'),
    metric("linearity_centered", "linearity of the update h_{l+1} − h_l",
           title='linearity of the update h(l+1) − h(l)', unit='score (1 = linear)'),
    metric("nonlinearity_mean", "mean per-token nonlinearity of l → l+1",
           title='per-token nonlinearity, mean', unit='residual norm (0–1)'),
    metric("nonlinearity__{}", "mean per-token nonlinearity of one token class (lens.text.token_classes)",
           title="nonlinearity, {} tokens", unit="residual norm (0–1)"),
)
S = Names(
    scalar("linearity_mean", "mean linearity over transitions",
           title='linearity, mean over transitions', unit='score (1 = linear)'),
    scalar("linearity_min", "lowest linearity", title='linearity, lowest', unit='score (1 = linear)'),
    scalar("linearity_min_layer", "source layer of the lowest linearity",
           title='source layer of the lowest linearity', unit='layer'),
    scalar("linearity_centered_mean", "mean centred linearity",
           title='centred linearity, mean', unit='score (1 = linear)'),
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
HEADLINES = (
        Headline("mean linearity score l → l+1", h.summary(S.linearity_mean),
                 "≈ 0.99 (Razzhigaev et al. 2024, 'secretly linear')"),
        Headline("most nonlinear token class", h.summary(S.most_nonlinear_class),
                 "filler / punctuation tokens (LLM-Microscope)"),
    )
CLAIMS = (
    Claim("mean linearity score l → l+1", "the map between consecutive layers is almost linear (≈ 0.99)",
          "Your Transformer is Secretly Linear (Razzhigaev et al. 2024)", h.summary(S.linearity_mean),
          Rule("agrees ≥ 0.98; weaker in [0.9, 0.98); else contradicts", agrees=(0.98, None), weaker=((0.9, 0.98),)),
          unit="score (1 = linear)"),
)
