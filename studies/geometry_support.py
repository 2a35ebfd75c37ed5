"""Helpers shared by the geometry studies (intrinsic-dim, anisotropy, linearity).

- which tokens enter the geometry (special tokens such as BOS/CLS/SEP are dropped by default:
  their states are huge outliers that would dominate every metric);
- reading every layer of a site from a store as float32 matrices over those tokens;
- the shuffled-text control transform (tokens shuffled within each document before capture,
  provided by :mod:`lens.transforms`).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from lens.errors import LensInputError

log = logging.getLogger(__name__)


def token_mask(store, drop_special: bool = True) -> np.ndarray:
    """Boolean mask over the store's tokens: which enter the geometry."""
    n = store.n_tokens
    mask = np.ones(n, dtype=bool)
    if drop_special and "special" in store.tokens:
        mask &= ~np.asarray(store.tokens["special"], dtype=bool)
    if not mask.any():
        raise LensInputError(f"the store's {n} tokens are all special tokens; expected some text tokens")
    return mask


def layer_states(store, site: str = "resid_post", mask: np.ndarray | None = None,
                 layers: list[int] | None = None) -> tuple[list[int], list[torch.Tensor]]:
    """Every (or the given) layer of ``site`` as float32 ``(token, d_model)`` tensors over ``mask``."""
    available = store.layers(site)
    chosen = available if layers is None else list(layers)
    missing = [l for l in chosen if l not in available]
    if missing:
        raise LensInputError(f"layers {missing} of {site} are not in the store: stored layers are {available}")
    idx = None if mask is None else torch.from_numpy(np.nonzero(mask)[0])
    mats = []
    for layer in chosen:
        X = store.get(layer=layer, site=site, dtype=torch.float32)
        mats.append(X if idx is None else X[idx.to(X.device)])
    return chosen, mats


def shuffle_transform():
    """The shuffled-text control: tokens shuffled within each document before capture
    (``lens.transforms``, recorded in the store manifest)."""
    from lens.transforms import parse_transform

    return parse_transform("shuffle")


def finite_or_none(values) -> list:
    """A list of floats with NaN/inf as None (results contract)."""
    out = []
    for v in np.asarray(values, dtype=float).tolist():
        out.append(v if np.isfinite(v) else None)
    return out
