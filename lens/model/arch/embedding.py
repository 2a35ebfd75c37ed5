"""What enters the first block: the position scheme (rotary, learned, ALiBi, none) and the factor between
the token-embedding table and block 0's input."""

from __future__ import annotations

import torch
from torch import nn

from lens.model.arch import names as N
from lens.model.arch.identities import close
from lens.model.arch.probe import Trace
from lens.model.arch.tree import class_name


def position_scheme(model: nn.Module, cfg) -> str:
    mt = getattr(cfg, "model_type", "")
    if mt in N.ALIBI_MODEL_TYPES or any(getattr(cfg, a, False) is True for a in N.ALIBI_ATTRS):
        return "alibi"
    for name, mod in model.named_modules():
        leaf = name.rpartition(".")[2]
        if leaf in N.POSITION_EMBEDDING_NAMES and (isinstance(mod, nn.Embedding) or "Position" in class_name(mod)):
            return "learned"
    for name, mod in model.named_modules():
        if name.rpartition(".")[2] in N.ROTARY_NAMES or "Rotary" in class_name(mod):
            return "rotary"
    if any(getattr(cfg, a, None) is not None for a in N.ROPE_ATTRS):
        return "rotary"
    return "none"


def embed_scale(model: nn.Module, trace: Trace, first_block: str) -> float | None:
    """The factor between the token-embedding table and block 0's input, when it is one (Gemma's √d)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rec_b = trace.get(first_block)
    weight = getattr(emb, "weight", None)
    if rec_b is None or rec_b.inp is None or trace.ids is None or not isinstance(weight, torch.Tensor):
        return None
    e = nn.functional.embedding(trace.ids, weight).float()
    x = rec_b.inp.float()
    if e.shape != x.shape:
        return None
    denom = float((e * e).sum())
    if denom == 0:
        return None
    s = float((e * x).sum()) / denom
    if abs(s - 1.0) < 1e-4 or not close(e * s, x):
        return None
    return s
