"""The share of attention each layer's heads give the first position of a window (the attention sink).

Read from the attention weights the model's own attention modules return, on a forward pass over windows as a
capture cuts them: a forward hook on each block's attention child (the first child named like one,
:data:`lens.model.arch.names.ATTENTION_NAMES`) keeps its second output when it is a (batch, head, query, key)
tensor. Transformers' eager attention returns those weights; SDPA / flash kernels return None, and a block with no
attention (state-space, recurrent) has none: the result then says the share is absent and why, never a stand-in.

Share of head h at layer l = the mean, over every real query position q ≥ 1 of every window, of its attention
weight on key position 0 (position 0 attends only to itself in a causal model, so it is left out). A head that
spread attention evenly over a window of n keys would give the first position about (1/q) on average; sink heads
give it most of their attention (Xiao et al. 2024, "Efficient streaming language models with attention sinks").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from lens.capturing.batches import pad_id, padded_tensors
from lens.model.arch.names import ATTENTION_NAMES
from lens.model.loading import attn_implementation

__all__ = ["FirstPositionAttention", "first_position_attention"]


@dataclass(frozen=True)
class FirstPositionAttention:
    """``share`` (layer, head): mean attention weight on position 0 over real query positions ≥ 1 (None when
    ``absent`` says why there are no weights); ``n_queries``: the query positions averaged over."""

    share: np.ndarray | None
    n_queries: int
    absent: str = ""

    @property
    def per_layer(self) -> np.ndarray | None:
        """(layer,): the mean over heads."""
        return None if self.share is None else self.share.mean(1)


def _attention_modules(model) -> list:
    found = []
    for block in model.layers:
        children = dict(block.named_children())
        found.append(next((children[n] for n in ATTENTION_NAMES if n in children), None))
    return found


@torch.inference_mode()
def first_position_attention(model, windows: Sequence[np.ndarray], *, batch_size: int = 8) -> FirstPositionAttention:
    """:class:`FirstPositionAttention` of ``model`` over ``windows`` (token ids, each starting where a capture
    window starts)."""
    modules = _attention_modules(model)
    missing = [l for l, m in enumerate(modules) if m is None]
    if missing:
        return FirstPositionAttention(None, 0, f"absent: block {missing[0]} of {model.model_id} has no attention "
                                               "module (a state-space or recurrent block)")
    impl = attn_implementation(model)
    if impl != "eager":
        return FirstPositionAttention(None, 0, f"absent: {model.model_id} runs attention as {impl!r}, which returns "
                                               "no attention weights (load it with attn='eager')")
    L = len(modules)
    got: dict = {}

    def hook(l):
        def keep(module, args, output):
            w = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            got[l] = w if isinstance(w, torch.Tensor) and w.dim() == 4 else None
        return keep

    sums, n_q = None, 0
    handles = [m.register_forward_hook(hook(l)) for l, m in enumerate(modules)]
    try:
        for lo in range(0, len(windows), batch_size):
            ids, att = padded_tensors(list(windows[lo:lo + batch_size]), pad_id(model.tokenizer))
            ids, att = ids.to(model.device), att.to(model.device)
            got.clear()
            model.hf_model(input_ids=ids, attention_mask=att, use_cache=False)
            if any(got.get(l) is None for l in range(L)):
                return FirstPositionAttention(None, 0, f"absent: {model.model_id}'s attention modules return no "
                                                       "(batch, head, query, key) weights")
            q = att.bool().clone()
            q[:, 0] = False  # position 0 attends only to itself
            qf = q.to(torch.float64)
            per = torch.stack([(got[l][:, :, :, 0].double() * qf[:, None, :]).sum((0, 2)) for l in range(L)])
            sums = per if sums is None else sums + per
            n_q += int(q.sum())
    finally:
        for h in handles:
            h.remove()
    if not n_q:
        return FirstPositionAttention(None, 0, "absent: no window holds a second position")
    return FirstPositionAttention((sums / n_q).cpu().numpy(), n_q)
