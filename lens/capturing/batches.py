"""Token ids cut into padded batches, and the id the padding holds: one way for the capture, the statistics
run, the span reader and the changed forward passes.

Right padding (the real tokens first) is what every forward pass here uses: a causal model's real tokens never
attend to the pads after them, and the attention mask hides them from an encoder. The prefix cache pads on the
left (:func:`left_padded`), so that every prompt's last token sits in the last column."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def pad_id(tokenizer) -> int:
    """The id padding holds: the tokenizer's pad token, else 0 (the attention mask hides it either way)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return pad if pad is not None else 0


def right_padded(ids: Sequence[Sequence[int] | np.ndarray], pad: int, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, attention mask), int64 arrays of (batch, width): each row's ids first, then ``pad``; ``width``
    defaults to the longest row."""
    width = max(len(c) for c in ids) if width is None else width
    x = np.full((len(ids), width), pad, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for i, c in enumerate(ids):
        x[i, :len(c)] = c
        mask[i, :len(c)] = 1
    return x, mask


def padded_tensors(ids: Sequence[Sequence[int]], pad: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`right_padded` as CPU ``torch.long`` tensors."""
    x, mask = right_padded(ids, pad, width)
    return torch.from_numpy(x), torch.from_numpy(mask)


def left_padded(ids: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, position ids), each (batch, width), the prompts right-aligned;
    position ids count real tokens from 0 (a pad gets 0), as a right-padded pass numbers them."""
    width = max(len(c) for c in ids)
    x = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, c in enumerate(ids):
        if len(c):
            x[i, width - len(c):] = torch.as_tensor(list(c))
            mask[i, width - len(c):] = 1
    return x, mask, (mask.cumsum(1) - 1).clamp_min(0)
