"""Helpers shared by the logit-lens, tuned-lens and layer-ablation studies."""

from __future__ import annotations

import numpy as np
import torch

from lens.errors import LensInputError
from lens.logit_lens import require_head
from studies.common import StudyConfig, bootstrap_group_means, cached_model


def lens_model(config: StudyConfig, study: str):
    """Load the study's model and refuse, before any capture, one without an LM head."""
    model = cached_model(config.model, config.device)
    try:
        require_head(model)
    except LensInputError as exc:
        raise LensInputError(f"{study}: {exc}") from None
    return model


def pick_windows(lengths, max_tokens: int, seed: int = 0) -> np.ndarray | None:
    """Indices (ascending) of whole windows, drawn at random (seeded) until their lengths add up to at
    least ``max_tokens``; None when all of them hold no more than that (use every window)."""
    if max_tokens is not None and max_tokens < 0:
        raise LensInputError(f"a token budget must be >= 0 (0 = all tokens); got {max_tokens}")
    lengths = np.asarray(lengths, dtype=np.int64)
    if not max_tokens or lengths.sum() <= max_tokens:
        return None
    order = np.random.default_rng(seed).permutation(len(lengths))
    cum = np.cumsum(lengths[order])
    return np.sort(order[: int(np.searchsorted(cum, max_tokens)) + 1])


def sample_windows(store, max_tokens: int, seed: int = 0) -> np.ndarray | None:
    """Store rows of whole windows drawn at random (:func:`pick_windows`, kept in store order), cut
    at ``max_tokens`` rows; None when the store has no more than that (use every row). Whole windows
    keep the text readable in the explorer's token view and every position in the window represented."""
    if max_tokens is not None and max_tokens < 0:
        raise LensInputError(f"lens_tokens must be >= 0 (0 = all tokens); got {max_tokens}")
    win = np.asarray(store.tokens["window"])
    starts = np.r_[0, np.nonzero(win[1:] != win[:-1])[0] + 1] if win.size else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], win.size]
    chosen = pick_windows(ends - starts, max_tokens, seed)
    if chosen is None:
        return None
    return np.concatenate([np.arange(starts[w], ends[w]) for w in chosen])[:max_tokens]


def site_states(store, site: str, n_layers: int, rows: np.ndarray | None = None) -> dict:
    """Every layer 0..n_layers-1 of ``site`` as float32 tensors (token, d_model), only ``rows`` when
    given; a clear error if a layer is missing."""
    have = store.layers(site) if store.has(site) else []
    missing = [l for l in range(n_layers) if l not in have]
    if missing:
        raise LensInputError(f"the lens needs every layer of {site} (0..{n_layers - 1}); the store lacks {missing}")
    if rows is None:
        return {l: store.get(l, site, dtype=torch.float32) for l in range(n_layers)}
    idx = torch.as_tensor(rows)
    return {l: store.get(l, site)[idx].float() for l in range(n_layers)}


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


def group_bootstrap_mean(values: np.ndarray, groups: np.ndarray, n_boot: int = 200, seed: int = 0,
                         level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of the mean of ``values`` (layer, token; NaN = not scored) with whole
    ``groups`` (documents or windows) resampled: (low, high) per layer."""
    values = np.asarray(values, dtype=np.float64)
    ok = ~np.isnan(values)
    codes = np.unique(np.asarray(groups), return_inverse=True)[1].reshape(-1)
    G = int(codes.max()) + 1 if codes.size else 0
    sums = np.stack([np.bincount(codes, weights=np.where(o, v, 0.0), minlength=G) for v, o in zip(values, ok)])
    counts = np.stack([np.bincount(codes, weights=o.astype(float), minlength=G) for o in ok])
    return bootstrap_group_means(sums, counts, n_boot, seed, level)
