"""Shape of stored token states: intrinsic dimension, anisotropy and outlier dimensions, linearity.

Everything here takes arrays (numpy, or torch tensors on any device) and returns numbers or frozen
result dataclasses; nothing here sees a model.

>>> import geometry
>>> geometry.TwoNN().fit(X).dimension_            # doctest: +SKIP
>>> geometry.MLE(n_neighbors=20).fit(X).dimension_  # doctest: +SKIP
>>> geometry.linearity_score(H3, H4)                # doctest: +SKIP
"""

from .anisotropy import (
    Anisotropy,
    AnisotropyProfile,
    anisotropy,
    anisotropy_by_layer,
    anisotropy_from_stats,
    anisotropy_profiles,
    intra_sentence_similarity,
    mean_cosine,
    mev,
    self_similarity,
    top_pc_share,
)
from .id_profile import LayerIntrinsicDim, intrinsic_dim_by_layer, intrinsic_dims_by_layer
from .intrinsic_dim import MLE, SKDIM_ESTIMATORS, TwoNN, make_estimator, skdim_estimator
from .linearity import (
    GroupMeans,
    LinearityProfile,
    aggregate_by_token,
    group_means,
    linearity_profile,
    linearity_score,
    token_nonlinearity,
)
from .nearest import METRICS, Nearest, nearest
from .neighbors import NeighborGraph, drop_duplicates, knn, neighbor_graph
from .outliers import (
    OutlierNeurons,
    RogueDimensions,
    cosine_contributions,
    outlier_neurons,
    rogue_dimensions,
)
from .postprocess import (
    POSTPROCESSING,
    clip_outliers,
    postprocess,
    remove_dims,
    remove_top_dims,
    standardize,
    zca_whiten,
)

__all__ = [
    # intrinsic dimension
    "TwoNN", "MLE", "skdim_estimator", "make_estimator", "SKDIM_ESTIMATORS",
    "intrinsic_dim_by_layer", "intrinsic_dims_by_layer", "LayerIntrinsicDim", "knn", "drop_duplicates",
    "neighbor_graph", "NeighborGraph",
    # nearest tokens of a few queries
    "nearest", "Nearest", "METRICS",
    # anisotropy and outliers
    "mean_cosine", "top_pc_share", "self_similarity", "intra_sentence_similarity", "mev",
    "anisotropy", "Anisotropy", "anisotropy_by_layer", "anisotropy_profiles", "AnisotropyProfile",
    "anisotropy_from_stats",
    "cosine_contributions", "rogue_dimensions", "RogueDimensions", "outlier_neurons", "OutlierNeurons",
    # post-processing
    "POSTPROCESSING", "postprocess", "standardize", "zca_whiten", "remove_dims", "remove_top_dims",
    "clip_outliers",
    # linearity
    "linearity_score", "token_nonlinearity", "linearity_profile", "LinearityProfile",
    "aggregate_by_token", "group_means", "GroupMeans",
]  # fmt: skip
