"""Live probing of a typed text: the only place the explorer runs a model (cached per process).

The logit lens of layer l decodes block l's output (read through the model's site map, the same
in every family) through the model's final norm and unembedding; the last layer uses the model's own
logits (which is what its lens equals).
"""

from __future__ import annotations

import numpy as np
import torch


def logit_lens(model, text: str, k: int = 5, max_tokens: int = 256) -> dict:
    """Per layer and token: loss / rank / entropy of the lens, and its top-k tokens.

    Returns numpy arrays: ``tokens`` (token,), ``layers`` (layer,), ``loss``, ``rank``, ``entropy``
    (layer, token; NaN at the last token, which has no next token), ``topk_tokens`` and ``topk_probs``
    (layer, token, k).
    """
    if not model.has_lm_head or not model.is_causal:
        raise ValueError(f"{model.model_id} has no causal LM head; the logit lens needs one")
    tok = model.tokenizer
    ids = tok(text, return_tensors="pt", truncation=True, max_length=max_tokens)["input_ids"]
    if ids.shape[1] < 2:
        raise ValueError("type at least two tokens")
    ids = ids.to(model.device)
    from lens.backends.native import NativeBackend
    from lens.sites import HookSite, Site

    hooks = [HookSite(Site.RESID_POST, l) for l in range(model.n_layers)]
    with torch.no_grad():
        states, out_logits = NativeBackend(model, hooks).run(ids, torch.ones_like(ids), return_logits=True)
        logits = [model.decode(states[h.key][0]) for h in hooks[:-1]] + [out_logits[0]]
        logp = torch.stack([torch.log_softmax(l.float(), -1) for l in logits])  # (layer, token, vocab)
    nxt = ids[0, 1:]
    n = ids.shape[1]
    loss = np.full((len(logits), n), np.nan, dtype=np.float32)
    rank = np.full((len(logits), n), np.nan, dtype=np.float32)
    true_lp = logp[:, :-1].gather(-1, nxt.view(1, -1, 1).expand(len(logits), -1, 1))[..., 0]
    loss[:, :-1] = (-true_lp).cpu().numpy()
    rank[:, :-1] = (logp[:, :-1] > true_lp[..., None]).sum(-1).cpu().numpy()
    entropy = (-(logp.exp() * logp).sum(-1)).cpu().numpy().astype(np.float32)
    top_p, top_i = logp.exp().topk(k, dim=-1)
    words = _decode_each(tok, top_i.cpu().numpy())
    return {"tokens": _decode_each(tok, ids[0].cpu().numpy()),
            "layers": np.arange(len(logits)), "loss": loss, "rank": rank, "entropy": entropy,
            "topk_tokens": words, "topk_probs": top_p.cpu().numpy()}


def _decode_each(tok, ids: np.ndarray) -> np.ndarray:
    """Each id as the text it stands for (no byte-level markers such as 'Ġ'), same shape as ``ids``."""
    uniq, inverse = np.unique(ids, return_inverse=True)
    texts = np.array([tok.decode([int(i)]) for i in uniq], dtype=str)
    return texts[inverse].reshape(ids.shape)
