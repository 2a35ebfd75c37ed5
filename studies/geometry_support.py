"""Helpers shared by the geometry studies (intrinsic-dim, anisotropy, linearity).

- which tokens enter the geometry (special tokens such as BOS/CLS/SEP are dropped by default:
  their states are huge outliers that would dominate every metric);
- reading every layer of a site from a store as float32 matrices over those tokens;
- the shuffled-text control transform (tokens shuffled within each document before capture).
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


class ShuffleWithinDocument:
    """Corpus transform: permute each document's token ids (before windowing) — the shuffled-text
    control of the intrinsic-dimension study. Same protocol as ``lens.transforms.CorpusTransform``
    (``apply_ids(ids, tokenizer, rng)``, ``describe()``); used only when lens has no such transform.
    """

    def apply_ids(self, ids: np.ndarray, tokenizer, rng: np.random.Generator) -> np.ndarray:
        return rng.permutation(np.asarray(ids))

    def describe(self) -> dict:
        return {"name": "shuffle-within-document"}


def shuffle_transform():
    """The lens shuffle transform when lens provides one, else :class:`ShuffleWithinDocument`."""
    try:
        from lens import transforms  # provided by the foundation in a later step
    except ImportError:
        return ShuffleWithinDocument()
    for name in ("ShuffleWithinDocument", "ShuffleTokens", "Shuffle"):
        cls = getattr(transforms, name, None)
        if cls is not None:
            try:
                return cls()
            except TypeError:
                continue
    return ShuffleWithinDocument()


def finite_or_none(values) -> list:
    """A list of floats with NaN/inf as None (results contract)."""
    out = []
    for v in np.asarray(values, dtype=float).tolist():
        out.append(v if np.isfinite(v) else None)
    return out
