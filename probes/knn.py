"""Leave-one-out kNN word-sense accuracy within groups (e.g. the contexts of one lemma).

For each context of a word, its k nearest other contexts of the same word (cosine distance) vote
on its sense; accuracy is the share of contexts whose sense wins the vote. This is the kNN sense
probe of the contextual-embedding literature (e.g. Wiedemann et al. 2019; SenseDict-style sense
centroids live in ``geometry``). Baselines computed on exactly the same contexts: ``chance`` — a
random other context of the word shares the sense, mean over contexts of (n_sense − 1)/(n_word − 1);
``most_frequent_sense`` — predict the most frequent sense among the word's other contexts. Ties (equal
cosines, level votes, level sense counts) are broken uniformly at random in expectation, so
accuracies are expected values and do not depend on the order of the contexts.

Axes: X (layer, context, d_model) or a sequence of (context, d_model); senses, groups (context,).
Groups with fewer than two contexts are skipped (no one to leave one out against).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from probes._common import as_numpy_1d, check_finite, get_layer, layer_count
from lens.runtime.threads import serial

# n²·d below which the CPU search runs on one thread (as geometry.neighbors): its ops are small,
# and on a busy machine each pooled op waits at its barrier (667 WordNet contexts x 31 layers at
# load ~6: 3.5-6.8 s pooled on 2 threads against 1.0 s on one, the same accuracies)
_SERIAL_WORK = 8192 * 8192 * 576

__all__ = ["KnnSenseProbe", "KnnSenseResult", "knn_sense_accuracy"]


@dataclass(frozen=True)
class KnnSenseResult:
    """layers (layer,); accuracy (layer,): micro-averaged LOO kNN accuracy over contexts;
    group_accuracy (layer, group): per group; groups (group,): group labels in that order;
    chance, most_frequent_sense: baselines (scalars, micro-averaged); n_contexts, n_groups; best_layer;
    group_sizes, group_chance, group_most_frequent_sense (group,): each group's contexts and its two baselines
    (means over its contexts), so a statistic can resample whole groups (the unit of independence)."""

    layers: np.ndarray
    accuracy: np.ndarray
    group_accuracy: np.ndarray
    groups: np.ndarray
    chance: float
    most_frequent_sense: float
    n_contexts: int
    n_groups: int
    best_layer: int
    group_sizes: np.ndarray | None = None
    group_chance: np.ndarray | None = None
    group_most_frequent_sense: np.ndarray | None = None


def _loo_knn_correct(x: torch.Tensor, s: np.ndarray, g: np.ndarray, k: int, chunk: int = 2048) -> np.ndarray:
    """Per-context expected correctness (0..1) of the leave-one-out cosine kNN vote within each group,
    for all groups at once: one neighbour graph per layer, restricted to same-group pairs.

    Ties are broken uniformly at random, in expectation, so the result depends neither on the order
    the contexts come in nor on a sort's tie order: candidates whose cosine equals the k-th largest
    share the places left among the k nearest equally (fractional votes); among senses with the
    most votes, the one whose nearest member is closest wins; senses still level share the win. A
    word whose contexts all have the same state (a static embedding; a causal model before the
    contexts differ) therefore scores exactly its most-frequent-sense baseline. Contexts are laid
    out group by group, so a chunk of rows needs only the contiguous columns of its groups (one
    matmul per chunk, not per group). Cosines are float64.
    """
    n = len(s)
    order = np.argsort(g, kind="stable")
    gs, ss = g[order], s[order]
    bounds = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1], True])
    first = np.repeat(bounds[:-1], np.diff(bounds))          # first row of each row's group
    last = np.repeat(bounds[1:], np.diff(bounds))            # one past its last row
    xs = torch.nn.functional.normalize(x[torch.as_tensor(order, device=x.device)].to(torch.float64), dim=1)
    gt = torch.as_tensor(gs, device=x.device)
    st = torch.as_tensor(ss, device=x.device)
    n_senses = int(ss.max()) + 1 if n else 0
    correct = np.empty(n, dtype=np.float64)
    for r0 in range(0, n, chunk):
        r1 = min(r0 + chunk, n)
        c0, c1 = int(first[r0]), int(last[r1 - 1])
        sim = xs[r0:r1] @ xs[c0:c1].T
        sim.masked_fill_(gt[r0:r1, None] != gt[None, c0:c1], -float("inf"))
        rows = torch.arange(r1 - r0, device=x.device)
        sim[rows, rows + (r0 - c0)] = -float("inf")          # leave one out
        valid = sim > -float("inf")
        n_valid = valid.sum(dim=1, keepdim=True)
        kk = torch.clamp(n_valid, max=k)                      # a group smaller than k + 1 has fewer
        kth = torch.topk(sim, min(k, c1 - c0), dim=1).values.gather(1, (kk - 1).clamp(min=0))
        above = valid & (sim > kth)
        level = valid & (sim == kth)
        share = (kk - above.sum(dim=1, keepdim=True)) / level.sum(dim=1, keepdim=True).clamp(min=1)
        weight = above.to(torch.float64) + level * share    # fractional votes at the k-th cosine
        onehot = torch.nn.functional.one_hot(st[c0:c1], n_senses).to(torch.float64)  # (col, sense)
        votes = weight @ onehot                              # (row, sense)
        nearest = torch.full((r1 - r0, n_senses), -float("inf"), dtype=torch.float64, device=x.device)
        nearest.scatter_reduce_(1, st[c0:c1].expand(r1 - r0, -1), torch.where(weight > 0, sim, -float("inf")),
                                reduce="amax")
        top = votes >= votes.max(dim=1, keepdim=True).values - 1e-9
        closest = torch.where(top, nearest, -float("inf"))
        win = top & (closest == closest.max(dim=1, keepdim=True).values)
        mine = win.gather(1, st[r0:r1, None])[:, 0]
        correct[order[r0:r1]] = (mine / win.sum(dim=1)).cpu().numpy()
    return correct


def _threads(device: torch.device, work: int):
    """One thread for a small search on CPU (:func:`lens.runtime.threads.serial`), else the configured pool."""
    if device.type != "cpu" or work > _SERIAL_WORK:
        return nullcontext()

    return serial()


def _baselines(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per context: chance (a random other context shares its sense) and the expected correctness of
    the most frequent sense among the word's other contexts (senses level at the top share the win)."""
    vals, inv, counts = np.unique(s, return_inverse=True, return_counts=True)
    n = len(s)
    chance = (counts[inv] - 1) / (n - 1)
    mfs = np.empty(n, dtype=np.float64)
    for i in range(n):
        c = counts.copy()
        c[inv[i]] -= 1
        mfs[i] = (c[inv[i]] == c.max()) / (c == c.max()).sum()
    return chance, mfs


class KnnSenseProbe:
    """``KnnSenseProbe(k=1).fit(X, senses, groups)``; fitted ``result_`` and ``accuracy_``."""

    def __init__(self, k: int = 1, layers=None, device=None):
        self.k = k
        self.layers = layers
        self.device = device

    def fit(self, X, senses, groups) -> "KnnSenseProbe":
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k: expected a positive integer, got {self.k!r}")
        n_layers = layer_count(X)
        x0 = get_layer(X, 0)
        n, d = int(x0.shape[0]), int(x0.shape[1])
        s = as_numpy_1d(senses, "senses", n)
        g = as_numpy_1d(groups, "groups", n)
        names, codes, sizes = np.unique(g, return_inverse=True, return_counts=True)
        keep_groups = np.flatnonzero(sizes >= 2)
        if len(keep_groups) == 0:
            raise ValueError("groups: expected at least one group with 2 or more contexts, got none")
        members = [np.flatnonzero(codes == c) for c in keep_groups]
        in_kept = np.flatnonzero(np.isin(codes, keep_groups))
        sense_codes = np.unique(s, return_inverse=True)[1].reshape(-1)
        chance, mfs = [], []
        for m in members:
            c, f = _baselines(s[m])
            chance.append(c)
            mfs.append(f)
        acc = np.zeros(n_layers)
        gacc = np.zeros((n_layers, len(members)))
        device = torch.device(self.device) if self.device is not None else x0.device
        with _threads(device, len(in_kept) ** 2 * d):
            for i in range(n_layers):
                x = (x0 if i == 0 else get_layer(X, i, n, d)).to(device)
                check_finite(x, f"X[{i}]")
                ok = np.zeros(n, dtype=np.float64)
                ok[in_kept] = _loo_knn_correct(x[torch.as_tensor(in_kept, device=device)], sense_codes[in_kept],
                                               codes[in_kept], self.k)
                gacc[i] = [ok[m].mean() for m in members]
                acc[i] = ok[in_kept].mean()
        layers = np.arange(n_layers) if self.layers is None else np.asarray(self.layers)
        self.result_ = KnnSenseResult(
            layers=layers, accuracy=acc, group_accuracy=gacc, groups=names[keep_groups],
            chance=float(np.concatenate(chance).mean()), most_frequent_sense=float(np.concatenate(mfs).mean()),
            n_contexts=int(sum(len(m) for m in members)), n_groups=len(members),
            best_layer=int(layers[int(np.argmax(acc))]),
            group_sizes=np.array([len(m) for m in members], dtype=np.int64),
            group_chance=np.array([c.mean() for c in chance]),
            group_most_frequent_sense=np.array([f.mean() for f in mfs]))
        self.accuracy_ = acc
        return self


def knn_sense_accuracy(X, senses, groups, k: int = 1) -> float:
    """LOO kNN sense accuracy of a single layer's states X (context, d_model)."""
    return float(KnnSenseProbe(k=k).fit([X], senses, groups).accuracy_[0])
