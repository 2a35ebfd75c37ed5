"""The model's head as a lens reads it: a :class:`Readout` (``logits = pre(layer, h) · weightᵀ + bias``) built
from the model's own final norm and unembedding (:func:`model_readout`), in float32 whatever the model's dtype
(:func:`decode_precision` says what ran); the logit and tuned lenses (:mod:`lens.readout.logit_lens`) decode
through it."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from lens.errors import LensInputError


def as_tensor(x, device=None, dtype=torch.float32) -> torch.Tensor:
    """numpy array / memmap / tensor on any device -> tensor on ``device``."""
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=dtype)
    return torch.as_tensor(np.asarray(x)).to(device=device, dtype=dtype)


def require_head(model) -> None:
    """The lens needs a final norm and an unembedding that reproduce the model's logits; encoders
    have neither, and a family whose head could not be reproduced says why (its model card)."""
    if not getattr(model, "has_lm_head", False):
        if hasattr(model, "card"):
            model.card().require_lm_head()
        raise LensInputError(
            f"{getattr(model, 'model_id', model)} has no language-model head: the logit / tuned lens needs "
            "the model's final norm and unembedding (expected a causal LM such as smollm2-135m; got an encoder)")


@dataclass(frozen=True)
class Readout:
    """How a lens turns a layer's state into logits: ``logits = pre(layer, h) · weightᵀ + bias``.

    ``pre`` maps (layer, (token, d_model) states) to final-normed states — the model's final norm for
    the logit lens, the final norm after a learned translator for the tuned lens; ``layer`` is None
    for the reference (last-layer) states. ``weight`` (d_vocab, d_model) and ``bias`` are the model's
    unembedding, with the family's logit scale folded in. Splitting the decoder this way lets the
    metrics reuse the unembedding: the KL term Σ_v p_final,v · logits_v is
    ``pre(h) · (p_final · W) + p_final · b``, one d_model-wide dot product per token instead of a
    pass over the vocabulary — except under a ``softcap`` (Gemma 2: ``c · tanh(z / c)`` after the
    unembedding), which is not linear, so the metrics then take that sum over the vocabulary.
    ``layer_free``: ``pre`` ignores the layer (the logit lens), so a layer whose states are the
    reference states has the reference's logits, decoded once per chunk.
    """

    pre: Callable[[int | None, torch.Tensor], torch.Tensor]
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    softcap: float | None = None
    layer_free: bool = False  # pre(layer, h) == pre(None, h) for every layer (no per-layer translator)

    def logits(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """float32 logits of already ``pre``-processed states ``x``, written into ``out`` when given
        (a reused (≥ token, d_vocab) float32 buffer; used when ``x`` and the weights are float32)."""
        if out is not None and x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            lg = torch.matmul(x, self.weight.T, out=out[: len(x)])
            if self.bias is not None:
                lg.add_(self.bias)
        else:
            lg = torch.nn.functional.linear(x, self.weight, self.bias).float()
        if self.softcap is not None:
            lg.div_(self.softcap).tanh_().mul_(self.softcap)
        return lg


def decode_precision(model) -> str:
    """What the lens decodes in, in the words a result records (module docstring)."""
    dtype = str(model.dtype).replace("torch.", "")
    if dtype == "float32":
        return "float32"
    return f"float32 ({dtype} model: final norm and unembedding upcast to float32)"


def _float32_head(model) -> list:
    """The final norm and the modules between it and the unembedding (OPT's project_out), in float32:
    the model's own where they are float32 already, else float32 copies made once per model (a few
    d_model-wide vectors; the unembedding itself is upcast by :func:`model_readout`)."""
    mods = [model.final_norm, *(model.hf_model.get_submodule(p) for p in model.site_map.head.chain)]
    mods = [m for m in mods if m is not None]  # no final norm in a post-norm decoder (GPT-1)
    tensors = [t for m in mods for t in (*m.parameters(), *m.buffers()) if t.is_floating_point()]
    if all(t.dtype == torch.float32 for t in tensors):
        return mods
    kept = model.extra.get("float32_head")
    if kept is None:
        kept = model.extra["float32_head"] = [copy.deepcopy(m).float() for m in mods]
    return kept


def model_readout(model, translate: Callable[[int, torch.Tensor], torch.Tensor] | None = None) -> Readout:
    """The model's own final norm and unembedding, after ``translate(layer, h)`` when given (tuned lens),
    in float32 whatever the model's dtype (module docstring)."""
    require_head(model)
    head = model.unembed_module
    before = _float32_head(model)  # [final norm (when the model has one), *chain]

    def head32(x):
        x = x.float()
        for m in before:
            x = m(x)
        return x

    if translate is None:
        def pre(layer, h):
            return head32(h)
    else:
        def pre(layer, h):
            return head32(h if layer is None else translate(layer, h))
    spec = model.site_map.head
    weight, bias = head.weight.float(), None if getattr(head, "bias", None) is None else head.bias.float()
    if spec.scale != 1.0:  # Cohere / Granite logit scale, folded into the unembedding once
        weight = weight * spec.scale
        bias = None if bias is None else bias * spec.scale
    return Readout(pre=pre, weight=weight, bias=bias, softcap=spec.softcap, layer_free=translate is None)
