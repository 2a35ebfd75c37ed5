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


def token_mask(store, drop_special: bool = True, min_pos: int = 0) -> np.ndarray:
    """Boolean mask over the store's tokens: which enter the geometry.

    ``min_pos`` drops tokens at window positions below it. The first position of a causal model's
    window is an attention sink with "massive activations" (Xiao et al. 2023; Sun et al. 2024):
    in SmolLM2-135M its norm is ~100x the others', so a few such tokens would dominate the top-PC
    share, the mean cosine and the linearity fit. Identical first tokens also give identical states.
    """
    n = store.n_tokens
    mask = np.ones(n, dtype=bool)
    if drop_special and "special" in store.tokens:
        mask &= ~np.asarray(store.tokens["special"], dtype=bool)
    if min_pos > 0:
        mask &= np.asarray(store.tokens["pos"]) >= min_pos
    if not mask.any():
        raise LensInputError(
            f"none of the store's {n} tokens is left after dropping special tokens and positions < {min_pos}; "
            "expected some text tokens")
    return mask


def position_norm_ratio(store, site: str = "resid_post", drop_special: bool = True,
                        min_pos: int = 1) -> list:
    """Per layer: mean state norm of the (non-special) tokens at positions < ``min_pos`` divided by
    that of the others — how massive the excluded first-position activations are (None if none)."""
    base = token_mask(store, drop_special, 0)
    pos = np.asarray(store.tokens["pos"])
    early, late = torch.from_numpy(base & (pos < min_pos)), torch.from_numpy(base & (pos >= min_pos))
    if not bool(early.any()) or not bool(late.any()):
        return [None] * len(store.layers(site))
    out = []
    for layer in store.layers(site):
        norms = torch.linalg.vector_norm(store.get(layer=layer, site=site, dtype=torch.float32), dim=1).cpu()
        out.append(float(norms[early].mean() / norms[late].mean()))
    return out


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
