"""Point clouds per "layer" with a known intrinsic dimension each, for the tests of ID profiles and their null."""

from __future__ import annotations

import numpy as np


def drifting_layers(dims, n: int, rng: np.random.Generator, D: int = 16, drift: float = 0.5) -> list[np.ndarray]:
    """One cloud per layer: ``n`` points on a random ``dims[l]``-dimensional linear subspace of R^D (Gaussian
    coordinates); a point's latent coordinates drift from layer to layer (``drift``: the share of fresh noise), so
    neighbouring layers are alike but not copies, as a model's layers are."""
    Z = rng.normal(size=(n, max(dims)))
    out = []
    for d in dims:
        Z = np.sqrt(1 - drift ** 2) * Z + drift * rng.normal(size=Z.shape)
        out.append(Z[:, :d] @ np.linalg.qr(rng.normal(size=(D, d)))[0].T)
    return out
