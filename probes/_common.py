"""Shared helpers for the probes: input coercion, validation and the fresh final norm.

Conventions used across ``probes/``: token states are 2-D ``(token, d_model)`` arrays (numpy or
torch, any device); a stack of layers is either a 3-D ``(layer, token, d_model)`` array or any
sequence whose items are 2-D ``(token, d_model)`` arrays (so a lazy view over an activation store
works without loading every layer at once). Per-token side arrays (labels, next-token ids,
document ids) are 1-D with one entry per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "as_tensor",
    "as_numpy_1d",
    "check_finite",
    "final_norm",
    "layer_count",
    "get_layer",
    "NORMS",
]

NORMS = ("rms", "layer", None)


def as_tensor(x: Any, name: str, ndim: int | None = None, device=None) -> torch.Tensor:
    """Return ``x`` as a torch tensor (no copy when it already is one), checking its rank."""
    if isinstance(x, torch.Tensor):
        t = x
    else:
        try:
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name}: expected a numeric array, got {type(x).__name__} ({exc})") from exc
    if device is not None:
        t = t.to(device)
    if ndim is not None and t.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {tuple(t.shape)}")
    return t


def as_numpy_1d(x: Any, name: str, n: int | None = None) -> np.ndarray:
    """Return a 1-D numpy array of length ``n`` (when given) from a numpy array, tensor or list."""
    if isinstance(x, torch.Tensor):
        a = x.detach().cpu().numpy()
    else:
        a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array with one entry per token, got shape {a.shape}")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name}: expected {n} entries (one per token), got {a.shape[0]}")
    return a


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise ValueError when ``t`` holds NaN or infinity."""
    # one reduction first: a NaN or inf anywhere makes the sum non-finite (cheap on big chunks)
    if t.is_floating_point() and not bool(torch.isfinite(t.sum())) and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name}: expected finite values, got {bad} NaN/inf entries")


def layer_count(X: Any) -> int:
    """Number of layers in a 3-D array or a sequence of 2-D arrays."""
    if isinstance(X, (torch.Tensor, np.ndarray)):
        if X.ndim != 3:
            raise ValueError(
                "X: expected a 3-D (layer, token, d_model) array or a sequence of 2-D "
                f"(token, d_model) arrays, got shape {tuple(X.shape)}"
            )
        return int(X.shape[0])
    if isinstance(X, Sequence) or (hasattr(X, "__len__") and hasattr(X, "__getitem__")):
        n = len(X)
        if n == 0:
            raise ValueError("X: expected at least one layer, got an empty sequence")
        return n
    raise ValueError(f"X: expected a 3-D array or a sequence of 2-D arrays, got {type(X).__name__}")


def get_layer(X: Any, i: int, n_tokens: int | None = None, d_model: int | None = None) -> torch.Tensor:
    """Layer ``i`` of ``X`` as a 2-D tensor, checking its shape against the other layers."""
    t = as_tensor(X[i], f"X[{i}]", ndim=2)
    if n_tokens is not None and t.shape[0] != n_tokens:
        raise ValueError(f"X[{i}]: expected {n_tokens} tokens like the other inputs, got {t.shape[0]}")
    if d_model is not None and t.shape[1] != d_model:
        raise ValueError(f"X[{i}]: expected d_model {d_model} like layer 0, got {t.shape[1]}")
    return t


def final_norm(x: torch.Tensor, kind: str | None, eps: float = 1e-5) -> torch.Tensor:
    """Apply a freshly initialised (unit weight, zero bias) final norm row-wise.

    He & Su (2024) pass every layer's states through a newly initialised copy of the model's final
    norm before the linear fit, so that layers are compared on the same scale: RMSNorm for
    Llama-style models (``"rms"``: x / sqrt(mean(x²) + eps)), LayerNorm otherwise (``"layer"``:
    (x − mean) / sqrt(var + eps)), or ``None`` for no norm.
    """
    if kind is None:
        return x
    if kind == "rms":
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    if kind == "layer":
        xc = x - x.mean(dim=-1, keepdim=True)
        return xc * torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + eps)
    raise ValueError(f"norm: expected one of 'rms', 'layer' or None, got {kind!r}")
