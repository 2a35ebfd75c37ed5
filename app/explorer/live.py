"""Live probing of a typed text: the only place the explorer runs a model (cached per process).

The text's ``resid_post`` states are taken through the same native hooks a capture uses and decoded
by :func:`lens.readout.logit_lens.logit_lens` — the one logit-lens implementation (the model's final norm and
unembedding; the last layer's lens is the model's own output).
"""

from __future__ import annotations

import numpy as np
import torch
from lens.capturing.backends import make_backend
from lens.text.corpora import token_strings
from lens.readout.logit_lens import logit_lens as decode
from lens.sites import HookSite, Site


@torch.inference_mode()
def logit_lens(model, text: str, k: int = 5, max_tokens: int = 256) -> dict:
    """Per layer and token: loss / rank / entropy of the lens, and its top-k tokens.

    Returns numpy arrays: ``tokens`` (token,), ``layers`` (layer,), ``loss``, ``rank``, ``entropy``
    (layer, token; NaN at the last token, which has no next token), ``topk_tokens`` and ``topk_probs``
    (layer, token, k).
    """
    if not model.has_lm_head or not model.is_causal:
        raise ValueError(f"{model.model_id} has no causal LM head; the logit lens needs one")
    ids = model.tokenizer(text, return_tensors="pt", truncation=True, max_length=max_tokens)["input_ids"]
    if ids.shape[1] < 2:
        raise ValueError("type at least two tokens")
    hooks = [HookSite(Site.RESID_POST, l) for l in range(model.n_layers)]
    out, _ = make_backend("native", model, hooks).run(ids.to(model.device), torch.ones_like(ids).to(model.device))
    states = {h.layer: out[h.key][0] for h in hooks}
    n = ids.shape[1]
    next_ids = np.r_[ids[0, 1:].numpy(), -1]
    res = decode(model, states, states[model.n_layers - 1], next_ids, top_k=k, topk_rows=np.arange(n))
    rank = res.token_rank.astype(np.float32)
    rank[res.token_rank < 0] = np.nan
    entropy = res.token_entropy.copy()
    return {"tokens": token_strings(model.tokenizer, ids[0].numpy()), "layers": res.layers, "loss": res.token_ce,
            "rank": rank, "entropy": entropy, "topk_tokens": token_strings(model.tokenizer, res.topk_ids.ravel()
                                                                          ).reshape(res.topk_ids.shape),
            "topk_probs": res.topk_probs}
