"""Input conversion and validation shared by the geometry estimators.

Every public function in ``geometry`` accepts numpy arrays, torch tensors (on any device) or nested
lists. They are converted here once, so that the error messages for bad input read the same
everywhere: a ``ValueError`` that says what was expected and what came (DESIGN.md, principle 7).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lens.runtime.threads import serial

__all__ = ["as_matrix", "check_finite_rows", "to_numpy", "resolve_device", "lapack_threads"]


def resolve_device(X: torch.Tensor, device: str | torch.device | None) -> torch.device:
    """The device to compute on: the caller's choice, else wherever ``X`` already lives."""
    return torch.device(device) if device is not None else X.device


def as_matrix(
    X: Any,
    name: str = "X",
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    min_rows: int = 1,
) -> torch.Tensor:
    """Convert ``X`` to a 2-D floating torch tensor ``(n_samples, n_features)`` without copying when possible.

    Integer and boolean inputs are promoted to float32; half precision is kept unless ``dtype`` says
    otherwise (callers that need accuracy pass ``dtype=torch.float32`` or ``torch.float64``).
    """
    if isinstance(X, torch.Tensor):
        T = X.detach()
    elif isinstance(X, np.ndarray):
        if X.dtype == object:
            raise ValueError(f"{name} must be a numeric array; got a numpy array of dtype object")
        T = torch.from_numpy(np.ascontiguousarray(X))
    else:
        try:
            T = torch.as_tensor(np.asarray(X, dtype=np.float64))
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{name} must be a numpy array, torch tensor or nested list of numbers; "
                f"got {type(X).__name__} ({exc})"
            ) from None
    if T.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D with shape (n_samples, n_features); got shape {tuple(T.shape)}"
        )
    if T.shape[1] < 1:
        raise ValueError(f"{name} must have at least 1 feature column; got shape {tuple(T.shape)}")
    if T.shape[0] < min_rows:
        raise ValueError(
            f"{name} must have at least {min_rows} rows (samples); got {T.shape[0]}"
        )
    if not (T.is_floating_point()):
        T = T.to(torch.float32)
    if dtype is not None or device is not None:
        T = T.to(dtype=dtype or T.dtype, device=device or T.device)
    return T


def check_finite_rows(X: torch.Tensor, name: str = "X") -> None:
    """Raise a ``ValueError`` naming the rows that hold NaN or infinite values.

    A row holding NaN or ±inf has a non-finite sum, so finite row sums settle it in one cheap pass
    (``isfinite`` of every entry costs ten times as much); only when some sum is not finite — a bad
    value, or a finite row whose sum overflows — are the entries themselves looked at."""
    if all(bool(torch.isfinite(X[s : s + 4096].sum(dim=1)).all()) for s in range(0, X.shape[0], 4096)):
        return
    bad = torch.cat([~torch.isfinite(X[s : s + 4096]).all(dim=1) for s in range(0, X.shape[0], 4096)])
    n_bad = int(bad.sum())
    if n_bad:
        rows = torch.nonzero(bad).flatten()[:5].tolist()
        more = "" if n_bad <= 5 else f" (first 5 of {n_bad})"
        raise ValueError(
            f"{name} must hold only finite values; got {n_bad} row(s) with NaN or inf, "
            f"at rows {rows}{more}. Drop or repair them before estimating."
        )


def to_numpy(X: Any) -> np.ndarray:
    """A numpy view (or copy, for device tensors) of ``X``; bfloat16/half are widened to float32."""
    if isinstance(X, torch.Tensor):
        X = X.detach()
        if X.dtype in (torch.bfloat16, torch.float16):
            X = X.to(torch.float32)
        return X.cpu().numpy()
    return np.asarray(X)


def lapack_threads(device: torch.device | str = "cpu"):
    """Run small CPU LAPACK calls (eigh, svd, lstsq on d_model-sized matrices) on one thread.

    The one place that does this is :func:`lens.runtime.threads.serial` (why, and how it stays safe when
    nested or used from several threads, is told there); this name is kept for its callers.
    """
    return serial(device)
