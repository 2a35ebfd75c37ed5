"""Anisotropy known answers: isotropic Gaussian ≈ 0, a planted rogue dimension carries its share."""

import numpy as np
import pytest
import torch

import geometry


@pytest.fixture(scope="module")
def iso():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1500, 128))
    words = rng.integers(0, 100, size=1500)
    sentences = np.repeat(np.arange(30), 50)
    return X, words, sentences


def planted(n=1500, d=128, share=0.6, seed=0, scale=5.0, noise=0.05):
    """Rows = scale·m + small noise, with m_0² = share·‖m‖²: dimension 0 carries ``share`` of the cosine."""
    rng = np.random.default_rng(seed)
    m = np.zeros(d)
    m[0] = np.sqrt(share)
    m[10:110] = np.sqrt((1 - share) / 100)
    return scale * m + noise * rng.normal(size=(n, d))


def test_isotropic_gaussian_has_anisotropy_near_zero(iso):
    X, words, sentences = iso
    a = geometry.anisotropy(X, words=words, sentences=sentences)
    assert abs(a.mean_cosine) < 0.01
    assert abs(a.top_pc_share_adjusted) < 0.01
    assert abs(a.self_similarity_adjusted) < 0.01
    assert abs(a.intra_sentence_similarity_adjusted) < 0.02
    assert abs(a.mev_adjusted) < 0.02
    np.testing.assert_allclose(a.cosine_contributions.sum(), a.mean_cosine, atol=1e-12)


def test_mean_cosine_closed_form_equals_pairwise_average():
    X = np.random.default_rng(1).normal(size=(60, 5)) + 0.7
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    C = U @ U.T
    brute = (C.sum() - np.trace(C)) / (60 * 59)
    assert geometry.mean_cosine(X) == pytest.approx(brute, abs=1e-12)
    assert geometry.mean_cosine(torch.tensor(X, dtype=torch.float32)) == pytest.approx(brute, abs=1e-6)


def test_planted_rogue_dimension_is_found_with_its_share():
    X = planted(share=0.6)
    r = geometry.rogue_dimensions(X, k=3)
    assert r.dims[0] == 0
    assert r.share[0] == pytest.approx(0.6, abs=0.01)
    assert r.mean_cosine > 0.9
    a = geometry.anisotropy(X)
    assert a.rogue_dims[0] == 0 and a.rogue_share == pytest.approx(r.top_share)


def test_self_similarity_and_intra_sentence_on_planted_structure():
    rng = np.random.default_rng(2)
    centres = rng.normal(size=(20, 64)) * 3
    words = rng.integers(0, 20, size=800)
    X = centres[words] + rng.normal(size=(800, 64))
    a = geometry.anisotropy(X, words=words, sentences=words)
    # occurrences of a word share a centre: high self-similarity, high MEV, far above baseline
    assert a.self_similarity_adjusted > 0.7
    assert a.mev_adjusted > 0.5
    assert a.intra_sentence_similarity_adjusted > 0.5


def test_anisotropy_by_layer_under_postprocessing():
    X = planted()
    layers = [np.random.default_rng(3).normal(size=X.shape), X]
    raw = geometry.anisotropy_by_layer(layers)
    assert raw.mean_cosine.shape == (2,) and raw.rogue_dims.shape == (2, 3)
    assert raw.cosine_contributions.shape == (2, 128)
    assert raw.mean_cosine[1] > 0.9
    for name in ("standardize", "whiten"):
        prof = geometry.anisotropy_by_layer(layers, postprocessing=name)
        assert abs(prof.mean_cosine[1]) < 0.01, name
    removed = geometry.anisotropy_by_layer(layers, postprocessing="remove_top", k_rogue=1)
    assert removed.cosine_contributions.shape == (2, 127)


def test_anisotropy_bad_input():
    with pytest.raises(ValueError, match="zero vectors"):
        geometry.mean_cosine(np.zeros((5, 3)))
    with pytest.raises(ValueError, match=r"one label per token, shape \(10,\); got shape \(9,\)"):
        geometry.anisotropy(np.ones((10, 3)) + np.eye(10, 3), words=np.arange(9))
    with pytest.raises(ValueError, match="NaN or inf"):
        geometry.anisotropy(np.full((10, 3), np.nan))
    with pytest.raises(ValueError, match="unknown post-processing 'pca'"):
        geometry.postprocess(np.ones((4, 3)), "pca")
