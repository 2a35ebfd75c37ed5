"""Per-layer intrinsic dimension with subsampling intervals."""

import numpy as np
import pytest

import geometry
from conftest import linear_subspace


@pytest.fixture(scope="module")
def layers():
    return [linear_subspace(600, d, seed=d) for d in (2, 4, 8)]


def test_profile_tracks_layer_dimension(layers):
    res = geometry.intrinsic_dim_by_layer(layers, "twonn", subsample=300, n_bootstrap=5, seed=1)
    assert res.layers.tolist() == [0, 1, 2]
    assert res.replicates.shape == (3, 5)
    assert np.all(np.diff(res.dimension) > 0)
    assert np.all(res.low <= res.dimension_boot) and np.all(res.dimension_boot <= res.high)
    for d, est in zip((2, 4, 8), res.dimension):
        assert abs(est - d) < 0.2 * d


def test_profile_accepts_mapping_estimator_objects_and_is_seeded(layers):
    states = {5: layers[0], 9: layers[1]}
    a = geometry.intrinsic_dim_by_layer(states, geometry.MLE(n_neighbors=10), subsample=200, n_bootstrap=3, seed=3)
    b = geometry.intrinsic_dim_by_layer(states, geometry.MLE(n_neighbors=10), subsample=200, n_bootstrap=3, seed=3)
    assert a.layers.tolist() == [5, 9]
    np.testing.assert_array_equal(a.replicates, b.replicates)


def test_profile_errors(layers):
    with pytest.raises(ValueError, match=r"layers \[7\] are not in states"):
        geometry.intrinsic_dim_by_layer({0: layers[0]}, layers=[7])
    with pytest.raises(ValueError, match="subsample must be between 3 and the number of tokens"):
        geometry.intrinsic_dim_by_layer(layers, subsample=10_000)
    with pytest.raises(ValueError, match="same tokens"):
        geometry.intrinsic_dim_by_layer([layers[0], layers[1][:100]])
