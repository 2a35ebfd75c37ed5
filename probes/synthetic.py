"""Synthetic token states with known answers, for tests and benchmarks of the probes.

``equal_gain_states``: layer l's states carry a designed amount of the next-token signal. With C
equally likely classes and states x = s_l·e_y (the class's one-hot in the first C coordinates) + ε,
ε ~ N(0, I_d), the population prediction residual of the best linear fit is

    PR_l = 1 / (1 + s_l² / C)

(the one-hot target covariance has C − 1 equal eigenvalues 1/C; each is shrunk by the factor
1/(1 + s²/C)). Choosing s_l² = C(1/PR_l − 1) with PR_l = PR_0·ρ^l gives the equi-learning law of
He & Su (2024) exactly: log PR linear in l, Pearson r = −1, decay ratio ρ.

``zipf_states``: a benchmark workload shaped like a real model's store (layers × tokens × d_model,
Zipf-distributed next tokens over a large vocabulary, class signal growing with depth); it has no
closed-form answer and is generated layer by layer so it never has to sit in memory whole.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["equal_gain_states", "ZipfStates"]


def equal_gain_states(n_tokens: int = 20000, n_layers: int = 8, d_model: int = 32, n_classes: int = 16,
                      pr0: float = 0.9, decay: float = 0.7, tokens_per_doc: int = 50, seed: int = 0):
    """States whose population PR is ``pr0 * decay**l`` at layer l (no norm applied).

    Returns ``(X, next_ids, docs, expected_pr)`` with X a float32 tensor (layer, token, d_model),
    next_ids (token,) int64 uniform over ``n_classes``, docs (token,) int64 and expected_pr (layer,).
    """
    if n_classes > d_model:
        raise ValueError(f"n_classes: expected at most d_model={d_model}, got {n_classes}")
    expected = pr0 * decay ** np.arange(n_layers, dtype=np.float64)
    if not np.all((expected > 0) & (expected <= 1)):
        raise ValueError(f"pr0 * decay**l: expected values in (0, 1], got {expected}")
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, n_classes, (n_tokens,), generator=g)
    onehot = torch.zeros(n_tokens, d_model)
    onehot[torch.arange(n_tokens), y] = 1.0
    scale = torch.as_tensor(np.sqrt(n_classes * (1.0 / expected - 1.0)), dtype=torch.float32)
    X = scale[:, None, None] * onehot[None] + torch.randn(n_layers, n_tokens, d_model, generator=g)
    docs = torch.arange(n_tokens) // tokens_per_doc
    return X, y, docs, expected


class ZipfStates(Sequence):
    """Lazy (layer, token, d_model) float32 states with Zipf-distributed next tokens.

    Layer l = signal_l · E[y] + noise, with E a fixed random (vocab, d_model) class embedding and
    signal_l rising with depth; ``next_ids`` (token,) and ``docs`` (token,) are attributes.
    Items are generated on access (deterministic per layer), so 30 × 100k × 576 never sits in memory.
    """

    def __init__(self, n_tokens: int = 100_000, n_layers: int = 30, d_model: int = 576,
                 vocab: int = 49152, zipf_a: float = 1.1, tokens_per_doc: int = 200, seed: int = 0):
        self.n_tokens, self.n_layers, self.d_model, self.vocab = n_tokens, n_layers, d_model, vocab
        self.seed = seed
        rng = np.random.default_rng(seed)
        ranks = np.arange(1, vocab + 1, dtype=np.float64)
        p = ranks ** -zipf_a
        p /= p.sum()
        self.next_ids = rng.choice(vocab, size=n_tokens, p=p).astype(np.int64)
        self.docs = np.arange(n_tokens, dtype=np.int64) // tokens_per_doc
        g = torch.Generator().manual_seed(seed)
        self._emb = torch.randn(vocab, d_model, generator=g) / np.sqrt(d_model)
        self._signal = np.geomspace(0.2, 4.0, n_layers)

    def __len__(self) -> int:
        return self.n_layers

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n_layers))]
        if not -self.n_layers <= i < self.n_layers:
            raise IndexError(i)
        i %= self.n_layers
        g = torch.Generator().manual_seed(self.seed * 1000 + i + 1)
        x = torch.randn(self.n_tokens, self.d_model, generator=g)
        x += float(self._signal[i]) * self._emb[torch.from_numpy(self.next_ids)]
        return x
