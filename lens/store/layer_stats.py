"""Per-layer statistics of a site's token states, summed over a corpus without keeping the states.

What the anisotropy and outlier-dimension measures of :mod:`geometry` need from a layer's rows X
(n × d) are sums, so they can be reduced where the model runs (NDIF, :mod:`lens.capturing.backends.server_side`)
and added up here, batch after batch, in float64:

* ``s1 = Σ(x − shift)`` and ``s2 = Σ(x − shift)(x − shift)ᵀ`` about a fixed ``shift`` near the
  mean (taking sums about a point near the mean keeps the variance from cancelling against a large
  mean): the mean ``shift + s1/n`` and the covariance ``(s2 − s1 s1ᵀ/n)/(n − 1)``
  (:func:`mean_from_sums`, :func:`cov_from_sums`), hence the top-PC share;
* ``su = Σ û`` and ``su2 = Σ û²`` of the unit rows û = x/‖x‖: each dimension's contribution to the
  mean cosine over all distinct pairs, ``(su² − su2)/(n(n − 1))`` (Timkey & van Schijndel 2021;
  :func:`cosine_contributions`), whose sum is the mean cosine (Ethayarajh 2019);
* ``sq_norm = Σ‖x‖²``.

:mod:`geometry.moments` computes the same quantities from stored rows through these functions,
so a figure from server-side sums and one from a captured store are the same arithmetic.
Saved as ``.npz`` (no pickle) with :func:`save_stats` / :func:`load_stats`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from lens.errors import LensInputError
from lens.runtime.atomic import atomic_path

NO_LAYER = -1  # layer label of a site without layers (embed, final_norm)
STATS_FILE = "stats.npz"


def mean_from_sums(n, shift, s1):
    """The mean of n rows from ``s1 = Σ(x − shift)``; numpy arrays or torch tensors, any leading axes."""
    return shift + s1 / n


def cov_from_sums(n, s1, s2):
    """The covariance (n − 1 denominator) from ``s1 = Σ(x − shift)`` (..., d) and
    ``s2 = Σ(x − shift)(x − shift)ᵀ`` (..., d, d) about any fixed shift; numpy or torch."""
    return (s2 - s1[..., :, None] * s1[..., None, :] / n) / (n - 1)


def cosine_contributions(n, su, su2):
    """Each dimension's contribution to the mean cosine over all distinct pairs of n rows, from the
    sums of their unit rows ``su`` and of its squares ``su2``; numpy or torch, any leading axes."""
    return (su * su - su2) / (n * (n - 1))


@dataclass(frozen=True)
class LayerStats:
    """Statistics of one site's token states, per layer, over ``n`` tokens (float64 sums).

    site : the site's name ("resid_post", ...).
    layers : [layer] layer labels (``NO_LAYER`` = -1 for a site without layers).
    n : number of tokens summed (every layer the same tokens).
    shift : [layer, d] the point the sums ``s1``, ``s2`` are taken about.
    s1 : [layer, d] Σ(x − shift).
    s2 : [layer, d, d] Σ(x − shift)(x − shift)ᵀ, or None when collected without the covariance.
    sq_norm : [layer] Σ‖x‖².
    su : [layer, d] Σ x/‖x‖ (all-zero rows add nothing). su2 : [layer, d] Σ (x/‖x‖)².
    n_zero : [layer] all-zero rows (no direction: a cosine with them is undefined).
    """

    site: str
    layers: np.ndarray
    n: int
    shift: np.ndarray
    s1: np.ndarray
    s2: np.ndarray | None
    sq_norm: np.ndarray
    su: np.ndarray
    su2: np.ndarray
    n_zero: np.ndarray

    @property
    def d(self) -> int:
        return int(self.shift.shape[1])

    @property
    def has_cov(self) -> bool:
        return self.s2 is not None

    @property
    def mean(self) -> np.ndarray:
        """[layer, d] mean state."""
        return mean_from_sums(self.n, self.shift, self.s1)

    @property
    def cov(self) -> np.ndarray:
        """[layer, d, d] covariance (n − 1 denominator)."""
        if self.s2 is None:
            raise LensInputError(f"the {self.site} statistics were collected without the covariance (cov=False): "
                                 "collect them with cov=True for a covariance or top-PC share")
        self._need(2, "a covariance")
        return cov_from_sums(self.n, self.s1, self.s2)

    @property
    def mean_sq_norm(self) -> np.ndarray:
        """[layer] mean squared norm ‖x‖²."""
        return self.sq_norm / self.n

    @property
    def cosine_contributions(self) -> np.ndarray:
        """[layer, d] each dimension's share of the mean cosine over all distinct token pairs."""
        self._need(2, "a mean cosine")
        if self.n_zero.any():
            bad = {int(l): int(c) for l, c in zip(self.layers, self.n_zero) if c}
            raise LensInputError(f"cosine similarity is undefined for zero vectors; the {self.site} statistics "
                                 f"counted all-zero rows at layers {bad}")
        return cosine_contributions(self.n, self.su, self.su2)

    @property
    def mean_cosine(self) -> np.ndarray:
        """[layer] mean cosine similarity over all distinct token pairs."""
        return self.cosine_contributions.sum(axis=1)

    def _need(self, k: int, what: str) -> None:
        if self.n < k:
            raise LensInputError(f"{what} needs at least {k} tokens; the {self.site} statistics hold {self.n}")

    def at(self, layer: int) -> "LayerStats":
        """The statistics of one layer (a ``[1]``-layer LayerStats)."""
        hits = np.nonzero(self.layers == layer)[0]
        if len(hits) == 0:
            raise LensInputError(f"layer {layer} is not in the {self.site} statistics: expected one of "
                                 f"{self.layers.tolist()}")
        i = slice(int(hits[0]), int(hits[0]) + 1)
        return replace(self, layers=self.layers[i], shift=self.shift[i], s1=self.s1[i],
                       s2=None if self.s2 is None else self.s2[i], sq_norm=self.sq_norm[i], su=self.su[i],
                       su2=self.su2[i], n_zero=self.n_zero[i])


def from_sums(site: str, layers, n: int, sums, triangles=None) -> LayerStats:
    """LayerStats of one batch from the server's reductions: ``sums`` [layer] of (5, d) blocks and
    ``triangles`` [layer] of the Gram matrices' upper triangles (see :mod:`lens.capturing.backends.server_side`)."""
    block = np.stack([np.asarray(_host(s), dtype=np.float64) for s in sums])  # (layer, 5, d)
    d = block.shape[2]
    s2 = None
    if triangles is not None:
        iu = np.triu_indices(d)
        s2 = np.zeros((len(block), d, d), dtype=np.float64)
        for i, t in enumerate(triangles):
            s2[i][iu] = np.asarray(_host(t), dtype=np.float64)
            s2[i] += np.triu(s2[i], 1).T
    return LayerStats(site=site, layers=np.asarray(layers, dtype=np.int64), n=int(n), shift=block[:, 0],
                      s1=block[:, 1], s2=s2, sq_norm=block[:, 4, 0].copy(), su=block[:, 2], su2=block[:, 3],
                      n_zero=block[:, 4, 1].round().astype(np.int64))


def _host(t):
    return t.detach().cpu().numpy() if hasattr(t, "detach") else t


def merge(a: LayerStats, b: LayerStats) -> LayerStats:
    """The statistics of the tokens of ``a`` and ``b`` together, about ``a``'s shift (float64)."""
    if a.site != b.site or not np.array_equal(a.layers, b.layers) or a.shift.shape != b.shift.shape \
            or a.has_cov != b.has_cov:
        raise LensInputError(f"cannot merge statistics of {a.site} layers {a.layers.tolist()} (d={a.d}, "
                             f"cov={a.has_cov}) with {b.site} layers {b.layers.tolist()} (d={b.d}, cov={b.has_cov})")
    if a.n == 0:
        return b
    if b.n == 0:
        return a
    delta = b.shift - a.shift  # Σ(x − a) = Σ(x − b) + n_b δ; the Gram sums move the same way
    s1 = a.s1 + b.s1 + b.n * delta
    s2 = None
    if a.s2 is not None:
        cross = delta[:, :, None] * b.s1[:, None, :]
        s2 = a.s2 + b.s2 + cross + cross.transpose(0, 2, 1) + b.n * delta[:, :, None] * delta[:, None, :]
    return replace(a, n=a.n + b.n, s1=s1, s2=s2, sq_norm=a.sq_norm + b.sq_norm, su=a.su + b.su, su2=a.su2 + b.su2,
                   n_zero=a.n_zero + b.n_zero)


_ARRAYS = tuple(f.name for f in fields(LayerStats) if f.name not in ("site", "n"))


def save_stats(stats: dict[str, LayerStats], path) -> Path:
    """Write ``{site: LayerStats}`` to one ``.npz`` (arrays ``<site>/<field>``; no pickle)."""
    path = Path(path)
    arrays = {}
    for site, s in stats.items():
        arrays[f"{site}/n"] = np.asarray(s.n, dtype=np.int64)
        for name in _ARRAYS:
            value = getattr(s, name)
            if value is not None:
                arrays[f"{site}/{name}"] = value
    with atomic_path(path, ".npz") as tmp:
        np.savez(tmp, **arrays)
    return path


def load_stats(path) -> dict[str, LayerStats]:
    """``{site: LayerStats}`` from a file :func:`save_stats` wrote."""
    with np.load(Path(path), allow_pickle=False) as z:
        sites = sorted({k.split("/")[0] for k in z.files})
        return {site: LayerStats(site=site, n=int(z[f"{site}/n"]),
                                 **{name: (z[f"{site}/{name}"] if f"{site}/{name}" in z.files else None)
                                    for name in _ARRAYS})
                for site in sites}
