"""Synthetic point clouds with a known intrinsic dimension, embedded in 576 dimensions.

576 is SmolLM2-135M's d_model. Each cloud is rotated by a random orthonormal map into the ambient
space and gets isotropic noise of total norm ≈ ``noise`` (per coordinate noise / √576).
"""

import numpy as np
import pytest

AMBIENT = 576


def _embed(Z: np.ndarray, rng: np.random.Generator, noise: float) -> np.ndarray:
    Q, _ = np.linalg.qr(rng.normal(size=(AMBIENT, Z.shape[1])))
    return Z @ Q.T + noise * rng.normal(size=(Z.shape[0], AMBIENT)) / np.sqrt(AMBIENT)


def hypersphere(n: int, d: int, seed: int = 0, noise: float = 1e-3) -> np.ndarray:
    """Uniform points on the unit d-sphere S^d ⊂ R^{d+1} (intrinsic dimension d)."""
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, d + 1))
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    return _embed(Z, rng, noise)


def swiss_roll(n: int, seed: int = 0, noise: float = 1e-3) -> np.ndarray:
    """The swiss roll, a 2-manifold in R^3, scaled to unit-ish size (intrinsic dimension 2)."""
    rng = np.random.default_rng(seed)
    t = 1.5 * np.pi * (1 + 2 * rng.uniform(size=n))
    h = 21 * rng.uniform(size=n)
    Z = np.stack([t * np.cos(t), h, t * np.sin(t)], axis=1) / 10.0
    return _embed(Z, rng, noise)


def linear_subspace(n: int, d: int, seed: int = 0, noise: float = 1e-3) -> np.ndarray:
    """Standard Gaussian in a random d-dimensional linear subspace (intrinsic dimension d)."""
    rng = np.random.default_rng(seed)
    return _embed(rng.normal(size=(n, d)), rng, noise)


@pytest.fixture(scope="session")
def clouds():
    """name -> (points, true dimension); shared by the tests of this folder."""
    return {
        "sphere2": (hypersphere(2000, 2, seed=1), 2),
        "sphere5": (hypersphere(2000, 5, seed=2), 5),
        "swiss_roll": (swiss_roll(2000, seed=3), 2),
        "subspace4": (linear_subspace(2000, 4, seed=4), 4),
    }
