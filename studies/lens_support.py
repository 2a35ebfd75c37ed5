"""Helpers shared by the logit-lens, tuned-lens and layer-ablation studies."""

from __future__ import annotations

import numpy as np
import torch

from lens.errors import LensInputError
from lens.logit_lens import require_head
from studies.common import StudyConfig, cached_model


def lens_model(config: StudyConfig, study: str):
    """Load the study's model and refuse, before any capture, one without an LM head."""
    model = cached_model(config.model, config.device)
    try:
        require_head(model)
    except LensInputError as exc:
        raise LensInputError(f"{study}: {exc}") from None
    return model


def site_states(store, site: str, n_layers: int) -> dict:
    """Every layer 0..n_layers-1 of ``site`` as float32 tensors (token, d_model); a clear error if one is missing."""
    have = store.layers(site) if store.has(site) else []
    missing = [l for l in range(n_layers) if l not in have]
    if missing:
        raise LensInputError(f"the lens needs every layer of {site} (0..{n_layers - 1}); the store lacks {missing}")
    return {l: store.get(l, site, dtype=torch.float32) for l in range(n_layers)}


def finite_or_none(values) -> list:
    return [float(v) if v is not None and np.isfinite(v) else None for v in np.asarray(values, dtype=float)]


def id_strings(tokenizer, ids: np.ndarray) -> np.ndarray:
    """Token text for an int array of any shape (decoded once per distinct id)."""
    from lens.corpora import token_strings

    ids = np.asarray(ids)
    if ids.size == 0:
        return np.zeros(ids.shape, dtype=str)
    return token_strings(tokenizer, ids.ravel()).reshape(ids.shape)


def text_mask(store, drop_special: bool) -> np.ndarray:
    mask = np.ones(store.n_tokens, bool)
    if drop_special:
        mask &= ~np.asarray(store.tokens["special"], dtype=bool)
    return mask
