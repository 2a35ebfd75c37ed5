"""He & Su (2024)'s prediction residual as their numbers are computed: in-sample least squares of the
next token's id, a scalar, on each layer's states.

For layer l with (freshly normed) states x_i and the next token's id t_i as a number,

    PR_l = Σ (t_i − t̂_i)² / Σ (t_i − t̄)²,   t̂ = the least-squares affine fit of t on x, fitted and scored
                                              on the same tokens (in-sample),

and the law's statistic is Pearson r of log PR_l against l (:func:`probes.pr_law.pr_law_summary`). This is
what the −0.983 … −0.997 of the paper were computed with (issue #37: the reference code regresses the
scalar token id, in-sample); :class:`probes.PredictionResidual` keeps the held-out one-hot ridge beside it.

Everything follows from per-group sums (Σx, Σxxᵀ, Σxt, Σt, Σt², n), so that

* the **interval** resamples whole units (documents, else windows): a delete-one-group jackknife over
  ``max_groups`` random groups of whole units (every unit its own group when there are at most that many),
  on Fisher's z = atanh(r). A bootstrap would refit on ~63% distinct units per replicate, and an in-sample
  fit on fewer tokens fits better (PR falls as d/N), so its replicates would not be centred on the
  estimate; a deleted group leaves (G−1)/G of the tokens and that bias almost unchanged;
* the **nested** values (the masks a caller passes, :func:`studies.core.stability.nested_units` in the study: a
  quarter of the units, a half holding it, all) are the same fit on those rows — an in-sample fit drifts
  with the tokens per dimension, and these values say by how much.

Tokens whose next id is −1 are dropped. Fewer tokens than state dimensions + 1 interpolate (PR = 0): refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from scipy import stats
from tqdm.auto import tqdm

from probes._common import NORMS, as_numpy_1d, check_finite, final_norm, get_layer, layer_count
from probes.pr_law import PRLawSummary, pr_law_summary

__all__ = ["TokenIdPR", "TokenIdPRResult", "RowShare", "in_sample_pr", "fisher_jackknife_interval"]

#: per-group moments are kept between the fit and the jackknife up to this many float64 values (256 MiB)
_KEEP_GROUP_ELEMENTS = 1 << 25


@dataclass(frozen=True)
class TokenIdPRResult:
    """layers (layer,); pr (layer,): in-sample token-id PR; summary: the law's fit of it; pearson_interval
    (2,): 95% jackknife interval of r over groups of whole units; jackknife_r (group,): r with each group
    left out; nested_pr (3, layer) / nested_r (3,) / nested_n (3,): the fit on nested subsamples of the units
    (N/4, N/2, N; None where it cannot be fitted); n_tokens: tokens fitted; n_units / n_groups."""

    layers: np.ndarray
    pr: np.ndarray
    summary: PRLawSummary
    pearson_interval: np.ndarray
    jackknife_r: np.ndarray
    nested_pr: list
    nested_r: list
    nested_n: list
    n_tokens: int
    n_units: int
    n_groups: int


@dataclass(frozen=True)
class RowShare:
    """One process's share of a fit spread over several (torchrun ranks, :mod:`studies.prediction_gains.ranks`):
    ``mine`` (token,) the rows this process reads, the shares of all processes disjoint and covering every row;
    ``reduce(a)`` the element-wise sum of a float64 array over every process (``torch.distributed.all_reduce``),
    returned. Each process sums its rows' moments per group, the sums are added up, and every process then fits
    on the totals: the same numbers as one process reading every row (float64 sums in another order)."""

    mine: np.ndarray
    reduce: Callable[[np.ndarray], np.ndarray]


def _pack(parts: list) -> np.ndarray:
    return np.concatenate([np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in m]) for m in parts])


def _unpack(flat: np.ndarray, d: int, n: int) -> list:
    size = 1 + d + d * d + d + 2
    out = []
    for g in range(n):
        a = flat[g * size:(g + 1) * size]
        out.append((float(a[0]), a[1:1 + d], a[1 + d:1 + d + d * d].reshape(d, d), a[1 + d + d * d:1 + 2 * d + d * d],
                    float(a[-2]), float(a[-1])))
    return out


def _moments(x, t) -> tuple:
    """(n, Σx, Σxxᵀ, Σxt, Σt, Σt²) of rows x (float64, numpy or torch: torch's Gram is the faster) and
    targets t, as numpy."""
    if isinstance(x, torch.Tensor):
        tt = torch.as_tensor(t, dtype=x.dtype)
        return (float(len(t)), x.sum(0).numpy(), (x.T @ x).numpy(), (x.T @ tt).numpy(), float(tt.sum()),
                float(tt @ tt))
    return (float(len(t)), x.sum(0), x.T @ x, x.T @ t, float(t.sum()), float(t @ t))


def _sub(a: tuple, b: tuple) -> tuple:
    return tuple(u - v for u, v in zip(a, b))


def _add(a: tuple, b: tuple) -> tuple:
    return tuple(u + v for u, v in zip(a, b))


def _groups(shell: np.ndarray, unit_codes: np.ndarray, max_groups: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(group per row, shell per group): whole units put at random into about ``max_groups`` groups, each group
    within one shell of the nested subsamples (so a subsample's sums are its groups' sums, not a second pass
    over its rows); the shells share the groups in proportion to their units, every unit its own group when
    there are no more units than that."""
    pairs, codes = np.unique(np.stack([shell, unit_codes]), axis=1, return_inverse=True)
    codes = codes.reshape(-1)
    n_pairs = pairs.shape[1]
    rng = np.random.default_rng(seed)
    group_of_pair = np.empty(n_pairs, np.int64)
    group_shell, start = [], 0
    for sh in np.unique(pairs[0]):
        idx = np.flatnonzero(pairs[0] == sh)
        n_g = len(idx) if n_pairs <= max_groups else min(len(idx), max(1, round(max_groups * len(idx) / n_pairs)))
        group_of_pair[idx[rng.permutation(len(idx))]] = start + np.arange(len(idx)) % n_g
        group_shell += [int(sh)] * n_g
        start += n_g
    return group_of_pair[codes], np.asarray(group_shell, np.int64)


def in_sample_pr(m: tuple) -> float:
    """PR of the in-sample least-squares affine fit from moments ``m`` (:func:`_moments`):
    (TSS − bᵀ G⁻¹ b) / TSS with G, b the centred Gram and cross-products. Raises ValueError when the
    tokens cannot determine the fit (no more tokens than dimensions) or the targets do not vary."""
    n, sx, sxx, sxt, st, stt = m
    d = sx.shape[0]
    if n <= d + 1:
        raise ValueError(f"tokens: in-sample least squares on {d}-wide states needs more than {d + 1} tokens "
                         f"(fewer interpolate, PR = 0), got {int(n)}")
    mu = sx / n
    G = sxx - n * np.outer(mu, mu)
    b = sxt - mu * st
    tss = stt - st * st / n
    if not tss > 0:
        raise ValueError("next_ids: the next-token ids do not vary; PR is undefined")
    # torch's Cholesky: scipy's (its own multi-threaded OpenBLAS) spin-waits on a busy machine, ~40× slower
    Gt, bt = torch.from_numpy(np.ascontiguousarray(G)), torch.from_numpy(np.ascontiguousarray(b))
    L, info = torch.linalg.cholesky_ex(Gt)
    if int(info) == 0:  # bᵀ G⁻¹ b = ‖L⁻¹ b‖² with G = L Lᵀ
        z = torch.linalg.solve_triangular(L, bt[:, None], upper=False)
        explained = float((z * z).sum())
    else:  # a singular Gram (collinear states): the minimum-norm solution
        explained = float(b @ np.linalg.lstsq(G, b, rcond=None)[0])
    rss = max(tss - explained, 0.0)
    return rss / tss


def fisher_jackknife_interval(full: float, left_out, level: float = 0.95) -> np.ndarray:
    """Delete-one-group jackknife interval of a correlation: on z = atanh(r), z ± q·SE with
    SE² = (G−1)/G Σ (z₋g − z̄)², mapped back with tanh. NaN when fewer than 2 finite values."""
    vals = np.asarray([v for v in left_out if v is not None and math.isfinite(v)], float)
    if len(vals) < 2 or not math.isfinite(full):
        return np.full(2, np.nan)
    clip = 1 - 1e-12
    z = np.arctanh(np.clip(vals, -clip, clip))
    g = len(z)
    se = math.sqrt((g - 1) / g * float(((z - z.mean()) ** 2).sum()))
    q = float(stats.norm.ppf(0.5 + level / 2))
    zf = math.atanh(max(-clip, min(clip, full)))
    return np.tanh([zf - q * se, zf + q * se])


def _shells(nested_masks, n: int, rows: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """The nested masks (over ``n`` tokens) cut to ``rows`` and checked to nest, and each row's shell: the
    first nested subsample holding it (rows in none: one more shell)."""
    masks = [as_numpy_1d(m, "nested_masks[]", n).astype(bool)[rows] for m in nested_masks]
    for a, b in zip(masks, masks[1:]):
        if (a & ~b).any():
            raise ValueError("nested_masks: expected each mask to hold the one before it")
    shell = np.full(len(rows), len(masks), np.int64)
    for k in reversed(range(len(masks))):
        shell[masks[k]] = k
    return masks, shell


class TokenIdPR:
    """``TokenIdPR(norm="rms").fit(X, next_ids, units, nested_masks)``: X a (layer, token, d) array, a
    sequence of (token, d) arrays or a lazy store view (``view.take(rows)[i]``: layer i's rows); ``next_ids``
    (token,) the next token's id (−1: none, dropped); ``units`` (token,) documents or windows, kept whole by
    the jackknife; ``nested_masks``: boolean row masks (token,) of nested subsamples (each holding the one
    before, unions of whole units) to fit again (the study passes :func:`studies.core.stability.nested_units`).
    ``result_`` holds everything. ``fit(..., share=RowShare(...))``: this process reads only its share of the rows
    and its per-group sums are added up with the other processes' (:class:`RowShare`)."""

    def __init__(self, norm: str | None = "rms", eps: float = 1e-5, layers=None, max_groups: int = 20,
                 seed: int = 0, confidence: float = 0.95, progress: bool = False):
        self.norm, self.eps, self.layers = norm, eps, layers
        self.max_groups, self.seed, self.confidence = max_groups, seed, confidence
        self.progress = progress

    def fit(self, X, next_ids, units, nested_masks=(), share: RowShare | None = None) -> "TokenIdPR":
        if self.norm not in NORMS:
            raise ValueError(f"norm: expected one of 'rms', 'layer' or None, got {self.norm!r}")
        if self.max_groups < 2:
            raise ValueError(f"max_groups: expected at least 2 groups for a jackknife, got {self.max_groups}")
        n_layers = layer_count(X)
        nxt = as_numpy_1d(next_ids, "next_ids")
        if not np.issubdtype(nxt.dtype, np.integer):
            raise ValueError(f"next_ids: expected integer token ids, got dtype {nxt.dtype}")
        unit = as_numpy_1d(units, "units", len(nxt))
        keep = nxt >= 0
        rows = np.flatnonzero(keep)
        if len(rows) < 3:
            raise ValueError(f"next_ids: expected at least 3 tokens with a next token, got {len(rows)}")
        t = nxt[rows].astype(np.float64)
        u_ids, u_codes = np.unique(unit[rows], return_inverse=True)
        n_units = len(u_ids)
        nested_masks, shell = _shells(nested_masks, len(nxt), rows)
        grp, group_shell = _groups(shell, u_codes, self.max_groups, self.seed)
        n_groups, n_shells = len(group_shell), len(nested_masks) + 1
        layers = np.arange(n_layers) if self.layers is None else np.asarray(self.layers)
        if layers.shape != (n_layers,):
            raise ValueError(f"layers: expected {n_layers} labels, got shape {layers.shape}")

        pr = np.full(n_layers, np.nan)
        jack = np.full((n_groups, n_layers), np.nan)
        nested_pr = np.full((len(nested_masks), n_layers), np.nan)
        local = np.arange(len(rows)) if share is None else np.flatnonzero(
            as_numpy_1d(share.mine, "share.mine", len(nxt)).astype(bool)[rows])
        for i in tqdm(range(n_layers), desc="token-id PR (in-sample)", unit="layer", disable=not self.progress):
            x = self._layer(X, i, rows[local], keep)
            t_l, grp_l = t[local], grp[local]
            d = x.shape[1]
            keep_groups = share is not None or n_groups * d * d <= _KEEP_GROUP_ELEMENTS
            parts = [] if keep_groups else None
            shells = [None] * n_shells
            members = [np.flatnonzero(grp_l == g) for g in range(n_groups)]
            group_m = [_moments(x[members[g]], t_l[members[g]]) for g in range(n_groups)] if keep_groups else None
            if share is not None:  # this process's sums per group, added up over every process
                group_m = _unpack(share.reduce(_pack(group_m)), d, n_groups)
            for g in range(n_groups):  # every group lies in one shell: the shells' sums are the groups'
                m = group_m[g] if keep_groups else _moments(x[members[g]], t_l[members[g]])
                k = group_shell[g]
                shells[k] = m if shells[k] is None else _add(shells[k], m)
                if keep_groups:
                    parts.append(m)
            cumulative, running = [], None
            for m in shells:
                running = m if running is None else (running if m is None else _add(running, m))
                cumulative.append(running)
            total = cumulative[-1]
            pr[i] = in_sample_pr(total)
            for g in range(n_groups):
                m = parts[g] if keep_groups else _moments(x[members[g]], t_l[members[g]])
                try:
                    jack[g, i] = in_sample_pr(_sub(total, m))
                except ValueError:
                    pass
            for k in range(len(nested_masks)):  # nested subsample k: the shells up to k
                try:
                    nested_pr[k, i] = pr[i] if cumulative[k] is total else in_sample_pr(cumulative[k])
                except (ValueError, TypeError):  # too few tokens, or an empty subsample
                    pass
        summary = pr_law_summary(layers, pr)
        jack_r = np.array([pr_law_summary(layers, row).pearson_r for row in jack])
        interval = fisher_jackknife_interval(summary.pearson_r, jack_r, self.confidence)
        nested_r = [None if not np.all(np.isfinite(row)) else pr_law_summary(layers, row).pearson_r
                    for row in nested_pr]
        nested_r = [None if v is None or not math.isfinite(v) else float(v) for v in nested_r]
        self.result_ = TokenIdPRResult(
            layers=layers, pr=pr, summary=summary, pearson_interval=np.asarray(interval), jackknife_r=jack_r,
            nested_pr=[[None if not math.isfinite(v) else float(v) for v in row] for row in nested_pr],
            nested_r=nested_r, nested_n=[int(m.sum()) for m in nested_masks], n_tokens=int(len(rows)),
            n_units=int(n_units), n_groups=n_groups)
        return self

    def _layer(self, X, i, rows, keep) -> torch.Tensor:
        """Layer i's kept rows, freshly normed, as a float64 CPU tensor."""
        if hasattr(X, "take") and hasattr(X, "store"):  # a lazy store view: read only these rows
            x = X.take(rows)[i]
        else:
            x = get_layer(X, i, len(keep))[torch.as_tensor(rows)]
        x = torch.as_tensor(x).to(dtype=torch.float64, device="cpu")
        check_finite(x, f"X[{i}]")
        return final_norm(x, self.norm, self.eps).contiguous()
