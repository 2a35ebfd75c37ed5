"""Maximum explainable variance of many word types at once (see :func:`geometry.anisotropy.mev`).

A word type's MEV is σ₁²/Σσ² of its occurrence matrix W — uncentred as Ethayarajh (2019) defines it,
or centred (W minus its mean occurrence: a PCA, as the paper's code, kawine/contextual, computes it) —
from the eigenvalues of the smaller Gram matrix (W Wᵀ when it has fewer occurrences than dimensions, else Wᵀ W). The sampled
word types and their shuffled-label baseline groups have the same sizes (shuffling keeps every
type's count and the sample is drawn from the counts), so :func:`mev_layout` lays out the rows once:
for each group size, the real groups of that size and then the shuffled ones, back to back. One
size is then one contiguous ``(groups, size, d)`` block — a view, no gather — and one batched Gram
matrix and one batched ``eigvalsh`` serve both the measure and its baseline. Each group's value is
the same arithmetic on the same rows as one ``eigvalsh`` per group (batched LAPACK calls solve each
matrix on its own), so the results equal the per-group loop exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lens.runtime.threads import serial

__all__ = ["MevLayout", "mev_groups", "mev_layout", "mev_pair"]


def mev_groups(codes: np.ndarray, min_count: int, max_words: int | None, seed: int,
               max_occurrences: int | None = None) -> list[np.ndarray]:
    """The row indices of each sampled word type: the types with at least ``max(2, min_count)``
    occurrences, at most ``max_words`` of them (a ``default_rng(seed)`` choice), each type's rows in
    row order — at most ``max_occurrences`` of them (a ``default_rng([seed, 1])`` choice, type by
    type in sample order, when it has more). The cap bounds MEV's cost: a type with m occurrences
    costs an m × m Gram matrix of d-wide rows and its eigenvalues, and a frequent token ("the",
    ",") has thousands in a 50k-token sample. A capped type's MEV is that of a random sample of its
    occurrences; its shuffled-label twin is capped to the same size, so the baseline matches."""
    if max_occurrences is not None and max_occurrences < 2:
        raise ValueError(f"max_occurrences must be at least 2 (MEV of one occurrence is 1); got {max_occurrences}")
    counts = np.bincount(codes)
    types = np.nonzero(counts >= max(2, min_count))[0]
    if len(types) == 0:
        return []
    if max_words is not None and len(types) > max_words:
        types = np.random.default_rng(seed).choice(types, size=max_words, replace=False)
    order = np.argsort(codes, kind="stable")
    starts = np.cumsum(counts) - counts
    groups = [order[starts[w] : starts[w] + counts[w]] for w in types]
    if max_occurrences is None or all(len(g) <= max_occurrences for g in groups):
        return groups
    rng = np.random.default_rng([seed, 1])
    return [g if len(g) <= max_occurrences else np.sort(rng.choice(g, size=max_occurrences, replace=False))
            for g in groups]


@dataclass(frozen=True)
class MevLayout:
    """Rows of the sampled groups and of their shuffled twins, laid out by group size.

    rows : the layer rows, block after block. blocks : per group size ``(size, groups, start)``,
    ``groups`` the positions (in sample order) of the sampled types of that size; the block holds
    their rows from ``start``, then their shuffled twins' rows. n_groups : sampled types."""

    rows: np.ndarray
    blocks: tuple
    n_groups: int

    def chunk_slots(self, n: int, chunk: int, device) -> list:
        """For each ``chunk`` of ``n`` rows: ``(slots, local)``, the positions in :attr:`rows` that
        fall in it and their rows within the chunk, as torch index tensors on ``device``."""
        out = []
        for s in range(0, n, chunk):
            slots = np.nonzero((self.rows >= s) & (self.rows < s + chunk))[0]
            out.append((torch.as_tensor(slots, device=device), torch.as_tensor(self.rows[slots] - s, device=device)))
        return out


def mev_layout(codes: np.ndarray, shuffled: np.ndarray, min_count: int, max_words: int | None,
               seed: int, max_occurrences: int | None = None) -> MevLayout | None:
    """The layout of the MEV sample of ``codes`` and of the same sample over ``shuffled`` (a
    permutation of ``codes``; :func:`mev_groups`); None when no type has enough occurrences."""
    real = mev_groups(codes, min_count, max_words, seed, max_occurrences)
    if not real:
        return None
    twin = mev_groups(shuffled, min_count, max_words, seed, max_occurrences)
    sizes = np.array([len(g) for g in real])
    if [len(g) for g in twin] != sizes.tolist():
        raise ValueError("shuffled must be a permutation of codes (the same count per type)")
    rows, blocks, start = [], [], 0
    for m in np.unique(sizes):
        idx = np.nonzero(sizes == m)[0]
        rows += [real[i] for i in idx] + [twin[i] for i in idx]
        blocks.append((int(m), idx, start))
        start += 2 * len(idx) * int(m)
    return MevLayout(rows=np.concatenate(rows).astype(np.int64), blocks=tuple(blocks), n_groups=len(real))


def mev_pair(Y: torch.Tensor, layout: MevLayout, centred: bool = False) -> tuple[float, float]:
    """``(mev, shuffled-baseline mev)`` from ``Y``, the rows of :attr:`MevLayout.rows` (any float
    dtype); ``centred``: each group's mean occurrence subtracted first.

    Groups with at most d occurrences: float64 Gram matrices and eigenvalues. Larger groups, whose
    d × d Gram matrix costs most of the time (a float64 ``eigvalsh`` of 576 × 576 takes 2.5 times a
    float32 one): float32 Gram matrix and largest eigenvalue, over the float64 sum of squares (Σσ²
    is the squared Frobenius norm). σ₁² of a float32 Gram matrix is within ~1e-6 of the float64
    value (4e-7 measured on SmolLM2), and a handful of such groups among hundreds moves the mean by
    ~1e-9."""
    if Y.ndim != 2 or Y.shape[0] != len(layout.rows):
        raise ValueError(f"Y must hold the layout's {len(layout.rows)} rows, shape ({len(layout.rows)}, d); "
                         f"got shape {tuple(Y.shape)}")
    d = Y.shape[1]
    vals = np.empty((2, layout.n_groups))
    small = [blk for blk in layout.blocks if blk[0] <= d]
    end = small[-1][2] + 2 * len(small[-1][1]) * small[-1][0] if small else 0
    Y64 = Y[:end].to(torch.float64)  # once, not once per block
    with serial(Y.device):
        for m, idx, start in layout.blocks:
            b = len(idx)
            if m <= d:
                W = _centre(Y64[start : start + 2 * b * m].view(2 * b, m, d), centred)
                ev = torch.linalg.eigvalsh(W @ W.transpose(1, 2)).clamp(min=0)
                r = ev[:, -1] / ev.sum(dim=1)
            else:
                W = _centre(Y[start : start + 2 * b * m].to(torch.float32).view(2 * b, m, d), centred)
                top = torch.linalg.eigvalsh(W.transpose(1, 2) @ W)[:, -1].to(torch.float64).clamp(min=0)
                r = top / (W * W).sum(dim=(1, 2), dtype=torch.float64)
            r = r.cpu().numpy()
            vals[0, idx], vals[1, idx] = r[:b], r[b:]
    return float(vals[0].mean()), float(vals[1].mean())


def _centre(W: torch.Tensor, centred: bool) -> torch.Tensor:
    """``(groups, occurrences, d)`` blocks, minus each group's mean occurrence when ``centred``."""
    return W - W.mean(dim=1, keepdim=True) if centred else W
