"""The word and context labels of an anisotropy run, prepared once for all of its layers.

Every layer of a run has the same tokens, so the label codes, the shuffled-label baselines, the
group sizes and the MEV sample (:mod:`geometry._mev`) are the same for every layer; preparing them
per layer repeated a ``unique``, two permutations, bincounts and argsorts 30 times. The random draws
are those of :func:`geometry.anisotropy.anisotropy`: ``default_rng(seed)`` permutes the word codes,
then the context codes, and the MEV sample is drawn from a fresh ``default_rng(seed)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._mev import MevLayout, mev_layout
from .arrays import to_numpy

__all__ = ["Groups", "label_codes"]


def label_codes(labels: Any, n: int, name: str) -> np.ndarray:
    """``labels`` (one per token) as codes 0..G-1 in sorted label order (``np.unique``'s inverse)."""
    arr = np.asarray(to_numpy(labels))
    if arr.shape != (n,):
        raise ValueError(f"{name} must have one label per token, shape ({n},); got shape {arr.shape}")
    return np.unique(arr, return_inverse=True)[1].reshape(-1)


class Groups:
    """Codes, group counts and the MEV layout of ``words`` / ``sentences`` (either may be None) for
    ``n`` tokens, with their torch index tensors made once per device (:meth:`on`).

    ``codes`` maps "w" (words), "s" (sentences) and "sp" (shuffled sentences) to code arrays;
    ``mev`` is the MEV sample of the words and of the shuffled words (None without words or when
    no word type has enough occurrences)."""

    def __init__(self, n: int, words: Any = None, sentences: Any = None, *, min_count: int = 2,
                 max_words: int | None = 2000, seed: int = 0, max_occurrences: int | None = None):
        self.n = n
        self.min_count = min_count
        rng = np.random.default_rng(seed)  # same draws, in the same order, as anisotropy()
        w = label_codes(words, n, "words") if words is not None else None
        s = label_codes(sentences, n, "sentences") if sentences is not None else None
        w_perm = rng.permutation(w) if w is not None else None
        s_perm = rng.permutation(s) if s is not None else None
        self.codes = {name: v for name, v in (("w", w), ("s", s), ("sp", s_perm)) if v is not None}
        self.has_words, self.has_sentences = w is not None, s is not None
        self.mev: MevLayout | None = (mev_layout(w, w_perm, min_count, max_words, seed, max_occurrences)
                                         if w is not None else None)
        self._dev: dict = {}

    def on(self, device: torch.device) -> dict:
        """``{"L": {name: codes}, "G": {name: groups}, "m": {name: float64 counts}, "keep": {name: mask}}``
        on ``device``: the groups each measure averages over are ``keep`` (words: the types with at
        least ``max(2, min_count)`` occurrences; contexts: at least 2).

        The word groups are renumbered: the kept types 0..K-1 in code order and every other token in
        one group K that no measure reads. A group sum's float64 additions are the same, in the
        same order, but the accumulator has K + 1 rows instead of one per type (~600 instead of
        ~5000 on 20k SmolLM2 tokens), which keeps it in cache."""
        key = str(device)
        if key not in self._dev:
            codes = dict(self.codes)
            if "w" in codes:
                counts = np.bincount(codes["w"])
                kept = counts >= max(2, self.min_count)
                codes["w"] = np.where(kept, np.cumsum(kept) - 1, int(kept.sum()))[codes["w"]]
            L = {k: torch.as_tensor(v, dtype=torch.long, device=device) for k, v in codes.items()}
            G = {k: int(v.max()) + 1 for k, v in codes.items()}
            m = {k: torch.bincount(L[k], minlength=G[k]).to(torch.float64) for k in L}
            keep = {k: m[k] >= 2 for k in L}
            if "w" in L:
                keep["w"] = torch.arange(G["w"], device=device) < int(kept.sum())
            self._dev[key] = {"L": L, "G": G, "m": m, "keep": keep}
        return self._dev[key]
