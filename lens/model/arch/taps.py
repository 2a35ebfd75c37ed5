"""How a site is read from a module: its first input or its first output, as a (batch, seq, width) tensor.

Used by the probe that derives a model's site map and by every capture backend, so a tap reads the
same tensor wherever it is read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INPUT = "input"
OUTPUT = "output"


@dataclass(frozen=True)
class Tap:
    """Where one site is read: ``path`` is a module path with ``{l}`` for the layer index, ``kind``
    is ``input`` (the tensor the module receives) or ``output`` (the first tensor it returns);
    ``flat_tokens`` marks modules that see tokens flattened to (batch·seq, width) (MoE routers)."""

    path: str
    kind: str
    flat_tokens: bool = False

    def at(self, layer: int | None) -> str:
        return self.path.format(l=0 if layer is None else layer)

    def to_dict(self) -> dict:
        return {"path": self.path, "kind": self.kind, "flat_tokens": self.flat_tokens}


def first_tensor(value) -> torch.Tensor | None:
    """The first tensor in a module output (a tensor, a tuple/list, or a ModelOutput)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):  # ModelOutput is an ordered dict of its non-None fields
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for v in value:
            if isinstance(v, torch.Tensor):
                return v
    return None


def input_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The hidden states a module receives: the first positional tensor, else ``hidden_states=``,
    else the first tensor keyword argument (blocks in transformers 5 are called with keywords)."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return kwargs["hidden_states"]
    for v in args:
        if isinstance(v, torch.Tensor):
            return v
    for v in kwargs.values():
        if isinstance(v, torch.Tensor):
            return v
    return None


def as_tokens(x: torch.Tensor, batch: int, seq: int, flat_tokens: bool) -> torch.Tensor:
    """(batch, seq, width) view of ``x``; a flat (batch·seq, width) router output is unflattened."""
    if flat_tokens and x.dim() == 2 and x.shape[0] == batch * seq:
        return x.reshape(batch, seq, x.shape[-1])
    return x
