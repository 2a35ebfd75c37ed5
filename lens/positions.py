"""Which token rows of a padded batch an analysis asks for: every real token, the last one, or given positions.

Positions count the *real* tokens of each sequence (padding on either side is skipped): 0 is its
first real token, -1 its last. ``"last"`` is ``[-1]``. A position a shorter sequence does not have
is skipped for that sequence (its rows are simply absent; :class:`Selection` says which rows came).
Rows come in (sequence, position) order, each at most once. Computed here, on the client; only the
flat index travels to the server, which gathers those rows inside the trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch

from lens.errors import LensInputError

ALL = "all"
LAST = "last"
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
    """``"all"``, or a tuple of integer positions (``"last"`` is ``(-1,)``); ``"0,5,-1"`` is accepted."""
    if isinstance(positions, str):
        text = positions.strip().lower()
        if text in (ALL, LAST):
            return ALL if text == ALL else (-1,)
        positions = [p for p in text.split(",") if p.strip()]
    if isinstance(positions, int):
        positions = [positions]
    try:
        out = tuple(_integer(p) for p in positions)
    except (TypeError, ValueError):
        raise LensInputError(f"positions must be 'all', 'last' or integers such as 0,5,-1; got {positions!r}") from None
    if not out:
        raise LensInputError("positions is empty: expected 'all', 'last' or at least one integer position")
    return out


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
    if chosen == ALL:
        keep = mask
    else:
        keep = torch.zeros_like(mask)
        for p in chosen:  # p counts from the start (p >= 0) or from each sequence's end (p < 0)
            want = (n_real + p if p < 0 else torch.full_like(n_real, p)).unsqueeze(1)
            keep |= mask & (rank == want)
    flat = keep.reshape(-1).nonzero().squeeze(1)
    seq_len = mask.shape[1]
    return Selection(index=flat, seq=flat // seq_len, pos=rank.reshape(-1)[flat])
