"""Which token rows of a sequence an analysis (or a capture) asks for: every real token, the last one,
every k-th, the first k, or given positions.

Positions count the *real* tokens of each sequence (padding on either side is skipped): 0 is its
first real token, -1 its last. The vocabulary (one place for ``lens stats``, ``collect_positions``
and ``lens capture --positions``):

* ``"all"`` — every real token;
* ``"last"`` — ``(-1,)``; ``"0,5,-1"`` or ``[0, 5, -1]`` — those positions;
* ``"every:K"`` — positions 0, K, 2K, ... of each sequence;
* ``"first:K"`` — positions 0 .. K-1 (all of a shorter sequence).

A position a shorter sequence does not have is skipped for that sequence (its rows are simply
absent; :class:`Selection` says which rows came). Rows come in (sequence, position) order, each at
most once. Computed here, on the client; only the flat index travels to the server, which gathers
those rows inside the trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np
import torch

from lens.errors import LensInputError

ALL = "all"
LAST = "last"
EVERY = "every"
FIRST = "first"
Positions = Union[str, int, Sequence[int]]


@dataclass(frozen=True)
class Selection:
    """The selected rows of one padded ``(batch, seq)`` batch.

    index : [row] flat position ``b * seq + column`` in the padded batch (what the server gathers).
    seq : [row] the batch row (sequence) each row comes from.
    pos : [row] its position among that sequence's real tokens (0 = first real token).
    """

    index: torch.Tensor
    seq: torch.Tensor
    pos: torch.Tensor

    @property
    def n(self) -> int:
        return int(self.index.numel())


def parse_positions(positions: Positions) -> str | tuple[int, ...]:
    """``"all"``, ``"every:K"`` / ``"first:K"`` (normalised, K >= 1), or a tuple of integer positions
    (``"last"`` is ``(-1,)``); ``"0,5,-1"`` is accepted."""
    if isinstance(positions, str):
        text = positions.strip().lower()
        if text in (ALL, LAST):
            return ALL if text == ALL else (-1,)
        kind, sep, k = text.partition(":")
        if sep and kind.strip() in (EVERY, FIRST):
            try:
                count = _integer(k.strip())
            except (TypeError, ValueError):
                count = 0
            if count < 1:
                raise LensInputError(f"positions {positions!r}: expected {kind.strip()}:K with K a positive integer")
            return f"{kind.strip()}:{count}"
        positions = [p for p in text.split(",") if p.strip()]
    if isinstance(positions, int):
        positions = [positions]
    try:
        out = tuple(_integer(p) for p in positions)
    except (TypeError, ValueError):
        raise LensInputError(f"positions must be 'all', 'last' or integers such as 0,5,-1, or every:K / first:K; "
                             f"got {positions!r}") from None
    if not out:
        raise LensInputError("positions is empty: expected 'all', 'last', every:K, first:K or at least one integer "
                             "position")
    return out


def positions_label(positions: Positions) -> str:
    """The canonical text of ``positions``: ``all``, ``last``, ``every:4``, ``first:8`` or ``0,5,-1``
    (what a store's manifest records and ``--positions`` takes back)."""
    chosen = parse_positions(positions)
    if isinstance(chosen, str):
        return chosen
    return LAST if chosen == (-1,) else ",".join(str(p) for p in chosen)


def keep_mask(rank: "torch.Tensor | np.ndarray", n_real, positions: Positions):
    """Which tokens ``positions`` keeps, given each token's ``rank`` among its sequence's real tokens
    (0 = first) and ``n_real``, the real-token count of its sequence (same shape, or broadcastable).
    Works on torch tensors and numpy arrays alike; padding must be masked out by the caller."""
    chosen = parse_positions(positions)
    if chosen == ALL:
        return rank >= 0
    if isinstance(chosen, str):
        kind, k = chosen.split(":")
        return (rank % int(k) == 0) if kind == EVERY else (rank < int(k))
    keep = rank < 0  # all false, of the right type and shape
    for p in chosen:  # p counts from the start (p >= 0) or from each sequence's end (p < 0)
        keep = keep | (rank == (n_real + p if p < 0 else p))
    return keep


def _integer(p) -> int:
    if isinstance(p, bool) or (isinstance(p, float) and not p.is_integer()):
        raise ValueError(p)
    return int(p)


def select_positions(attention_mask: torch.Tensor, positions: Positions = ALL) -> Selection:
    """The rows of a padded batch at ``positions`` (see the module docstring)."""
    chosen = parse_positions(positions)
    mask = attention_mask.bool().cpu()
    if mask.dim() != 2:
        raise LensInputError(f"attention_mask must be (batch, seq); got shape {tuple(mask.shape)}")
    n_real = mask.sum(dim=1)
    rank = mask.cumsum(dim=1) - 1  # position of each real token among its sequence's real tokens
    keep = mask & keep_mask(rank, n_real.unsqueeze(1), chosen)
    flat = keep.reshape(-1).nonzero().squeeze(1)
    seq_len = mask.shape[1]
    return Selection(index=flat, seq=flat // seq_len, pos=rank.reshape(-1)[flat])
