"""Adjusted Rand index (Hubert & Arabie 1985), exactly as ``sklearn.metrics.adjusted_rand_score``.

The sense study scores tens of thousands of tiny partitions (a word's handful of contexts); sklearn's
parameter validation costs ~1.5 ms a call there, the arithmetic microseconds. Here the pair counts
come from one integer contingency table per pair of labelings (``np.bincount``; all labelings of a
batch at once), and the final ratio is sklearn's own expression on the same Python integers, so
every value is bit-identical to sklearn's (tests/geometry/test_senses.py checks it on random and
degenerate partitions). Labels may be of any dtype; only the partition they induce matters.

Axes: labels (context,) or a batch (labeling, context).
"""

from __future__ import annotations

import numpy as np

__all__ = ["adjusted_rand_score", "adjusted_rand_scores"]


def _codes(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """Integer codes 0..m-1 of the values of ``labels`` (any shape) and m."""
    if labels.size == 0:
        return np.zeros(labels.shape, dtype=np.int64), 0
    uniq, inv = np.unique(labels.reshape(-1), return_inverse=True)
    return inv.reshape(labels.shape).astype(np.int64), len(uniq)


def _ari(tp: int, fp: int, fn: int, tn: int) -> float:
    # sklearn.metrics.adjusted_rand_score's final step, on the same Python ints (no rounding before it)
    if fn == 0 and fp == 0:
        return 1.0
    return 2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn))


def adjusted_rand_scores(labels_true, labels_pred) -> np.ndarray:
    """ARI of each row of ``labels_pred`` (labeling, context) against the same row of ``labels_true``
    (or against ``labels_true`` itself when it is one labeling (context,)); float64 (labeling,)."""
    a, b = np.asarray(labels_true), np.asarray(labels_pred)
    if b.ndim != 2:
        raise ValueError(f"labels_pred: expected a 2-D batch (labeling, context), got shape {b.shape}")
    if a.ndim == 1:
        a = np.broadcast_to(a, b.shape)
    if a.shape != b.shape:
        raise ValueError(f"labels_true, labels_pred: expected shapes (context,) or {b.shape}, got {a.shape}")
    n_rows, n = b.shape
    if n_rows == 0:
        return np.zeros(0)
    if n == 0:
        return np.ones(n_rows)
    ca, ma = _codes(a)
    cb, mb = _codes(b)
    cells = (np.arange(n_rows, dtype=np.int64)[:, None] * ma + ca) * mb + cb
    table = np.bincount(cells.reshape(-1), minlength=n_rows * ma * mb).reshape(n_rows, ma, mb)
    sum_squares = (table * table).sum((1, 2))
    rows = table.sum(2)
    cols = table.sum(1)
    tp = sum_squares - n                                  # pairs together in both
    fp = (cols * cols).sum(1) - sum_squares               # together in pred only
    fn = (rows * rows).sum(1) - sum_squares               # together in true only
    tn = n * n - fp - fn - sum_squares                    # apart in both (ordered pairs, as sklearn)
    return np.array([_ari(*v) for v in zip(tp.tolist(), fp.tolist(), fn.tolist(), tn.tolist())], dtype=np.float64)


def adjusted_rand_score(labels_true, labels_pred) -> float:
    """ARI of two labelings (context,) of the same contexts; equals sklearn's value bit for bit."""
    a, b = np.asarray(labels_true), np.asarray(labels_pred)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"labels_true, labels_pred: expected 1-D labelings, got shapes {a.shape} and {b.shape}")
    if len(a) != len(b):
        raise ValueError(f"labels_true, labels_pred: expected equal lengths, got {len(a)} and {len(b)}")
    return float(adjusted_rand_scores(a, b[None])[0])
