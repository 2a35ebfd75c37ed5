"""Steering along a 1-D direction: set the residual state's coordinate along ``direction`` to a value.

Minder et al. (2025, "Controllable Context Sensitivity and the Knob Behind It") find a 1-D subspace
in one layer whose coordinate decides whether the model answers from the context or from memory;
steering sets that coordinate: h ← h + (value − h·u) u with u the unit direction, on the output of
block ``layer`` (``resid_post``), at every position or only at given positions (e.g. each prompt's
last token). The hook is removed on exit, even after an exception; parameters are never touched.

``next_token_logits`` runs a batch of prompts (right-padded) and returns each prompt's last-token
logits — the quantity steering and context-aware decoding act on.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Sequence

import numpy as np
import torch

from lens.errors import LensInputError

__all__ = ["steer", "next_token_logits"]


def _unit(direction, d_model: int, device, dtype) -> torch.Tensor:
    u = torch.as_tensor(np.asarray(direction, dtype=np.float64) if not torch.is_tensor(direction) else direction)
    if u.ndim != 1 or u.shape[0] != d_model:
        raise LensInputError(f"direction: expected a vector of length d_model={d_model}, got shape {tuple(u.shape)}")
    nrm = float(u.double().norm())
    if not np.isfinite(nrm) or nrm == 0:
        raise LensInputError("direction: expected a finite non-zero vector")
    return (u.double() / nrm).to(device=device, dtype=dtype)


@contextmanager
def steer(model, layer: int, direction, value: float, positions: "torch.Tensor | Sequence[int] | None" = None):
    """Within the block, block ``layer``'s output has coordinate ``value`` along ``direction``.

    ``positions``: None steers every position; else one position per batch row (e.g. the last real
    token of each right-padded prompt)."""
    n = model.n_layers
    if not isinstance(layer, (int, np.integer)) or not 0 <= int(layer) < n:
        raise LensInputError(f"layer: expected a block index in 0..{n - 1}, got {layer!r}")
    if not np.isfinite(float(value)):
        raise LensInputError(f"value: expected a finite number, got {value!r}")
    u = _unit(direction, model.d_model, model.device, model.dtype)
    pos = None if positions is None else torch.as_tensor(list(positions) if not torch.is_tensor(positions)
                                                         else positions, dtype=torch.long)

    def hook(module, args, output):
        h = output[0] if isinstance(output, (tuple, list)) else output
        if pos is None:
            h = h + (float(value) - h @ u).unsqueeze(-1) * u
        else:
            if pos.shape[0] != h.shape[0]:
                raise LensInputError(f"positions: expected one per batch row ({h.shape[0]}), got {pos.shape[0]}")
            h = h.clone()
            rows = torch.arange(h.shape[0], device=h.device)
            sel = h[rows, pos.to(h.device)]
            h[rows, pos.to(h.device)] = sel + (float(value) - sel @ u).unsqueeze(-1) * u
        if isinstance(output, tuple):
            return (h,) + tuple(output[1:])
        if isinstance(output, list):
            return [h] + list(output[1:])
        return h

    handle = model.layers[int(layer)].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@torch.inference_mode()
def next_token_logits(model, prompts: Sequence[str], *, batch_size: int = 16, steering: dict | None = None,
                      add_special_tokens: bool = False) -> torch.Tensor:
    """(prompt, d_vocab) float32 logits at each prompt's last token. ``steering``: keyword arguments
    of :func:`steer` without ``positions`` (the last token of each prompt is steered)."""
    if not model.has_lm_head:
        raise LensInputError(f"{model.model_id} has no language-model head: next-token logits need a causal LM")
    ids = [model.tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"] for p in prompts]
    if not ids or any(len(x) == 0 for x in ids):
        raise LensInputError("expected at least one non-empty prompt")
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    out = []
    for lo in range(0, len(ids), batch_size):
        chunk = ids[lo:lo + batch_size]
        width = max(len(c) for c in chunk)
        x = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, c in enumerate(chunk):
            x[i, :len(c)] = torch.as_tensor(c)
            mask[i, :len(c)] = 1
        last = torch.as_tensor([len(c) - 1 for c in chunk])
        kwargs = dict(input_ids=x.to(model.device), attention_mask=mask.to(model.device), use_cache=False)
        # the base model's output is already final-normed; unembedding only the last positions
        # saves a (seq, d_vocab) product per prompt (most of the cost for a 49k vocabulary)
        base = model.hf_model.base_model
        if steering:
            with steer(model, positions=last, **steering):
                h = base(**kwargs).last_hidden_state
        else:
            h = base(**kwargs).last_hidden_state
        logits = model.unembed(h[torch.arange(len(chunk)), last.to(h.device)])
        out.append(logits.float().cpu())
    return torch.cat(out)
