"""ELMo-style scalar mix probe (Peters et al. 2018, "Deep contextualized word representations").

The probe reads a learned mixture of all layers, h = γ Σ_l s_l h_l with s = softmax(w), through a
linear softmax classifier; w, γ and the classifier are trained jointly (full-batch Adam on
cross-entropy). The mix weights s (layer,) say which layers the task draws on. Each layer is first
standardised with training statistics so that a layer's scale (residual streams grow with depth)
does not decide its weight. Documents (``groups``) are split into train and held-out test.

Axes: X (layer, token, d_model) or a sequence of (token, d_model); labels, groups (token,).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from probes._common import as_numpy_1d, check_finite, get_layer, layer_count

__all__ = ["ScalarMixProbe", "ScalarMixResult"]


@dataclass(frozen=True)
class ScalarMixResult:
    """layers (layer,); weights (layer,): softmax mix weights, summing to one; gamma: the scale;
    accuracy / train_accuracy: held-out and training accuracy of the mixed probe."""

    layers: np.ndarray
    weights: np.ndarray
    gamma: float
    accuracy: float
    train_accuracy: float


class ScalarMixProbe:
    """``ScalarMixProbe().fit(X, labels, groups=docs)``; fitted ``weights_``, ``gamma_``, ``accuracy_``."""

    def __init__(self, n_epochs: int = 300, lr: float = 0.05, weight_decay: float = 1e-4,
                 test_fraction: float = 0.2, seed: int = 0, device=None, layers=None):
        self.n_epochs = n_epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.test_fraction = test_fraction
        self.seed = seed
        self.device = device
        self.layers = layers

    def _split(self, n, groups):
        rng = np.random.default_rng(self.seed)
        if groups is None:
            test = np.zeros(n, bool)
            test[rng.permutation(n)[: max(1, int(round(self.test_fraction * n)))]] = True
            return test
        g = as_numpy_1d(groups, "groups", n)
        uniq = np.unique(g)
        if len(uniq) < 2:
            raise ValueError(f"groups: expected at least 2 distinct groups for a train/test split, got {len(uniq)}")
        n_te = min(len(uniq) - 1, max(1, int(round(self.test_fraction * len(uniq)))))
        return np.isin(g, rng.permutation(uniq)[:n_te])

    def fit(self, X, labels, groups=None) -> "ScalarMixProbe":
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"test_fraction: expected a value in (0, 1), got {self.test_fraction}")
        n_layers = layer_count(X)
        x0 = get_layer(X, 0)
        n, d = int(x0.shape[0]), int(x0.shape[1])
        y_raw = as_numpy_1d(labels, "labels", n)
        classes, y = np.unique(y_raw, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(f"labels: expected at least 2 classes, got {len(classes)}")
        test = self._split(n, groups)
        device = torch.device(self.device) if self.device is not None else x0.device
        stack = torch.empty(n_layers, n, d, dtype=torch.float32, device=device)
        for i in range(n_layers):
            t = (x0 if i == 0 else get_layer(X, i, n, d)).to(device=device, dtype=torch.float32)
            check_finite(t, f"X[{i}]")
            tr = t[torch.as_tensor(~test, device=device)]
            stack[i] = (t - tr.mean(0)) / (tr.std(0) + 1e-6)
        yt = torch.as_tensor(y, device=device)
        tr_idx = torch.as_tensor(np.flatnonzero(~test), device=device)
        te_idx = torch.as_tensor(np.flatnonzero(test), device=device)

        torch.manual_seed(self.seed)
        w = torch.zeros(n_layers, device=device, requires_grad=True)
        gamma = torch.ones((), device=device, requires_grad=True)
        head = torch.nn.Linear(d, len(classes)).to(device)
        params = [w, gamma, head.weight, head.bias]
        decay = [0.0, 0.0, self.weight_decay, 0.0]

        # the split's rows gathered once (a gather per epoch moved layers × rows × d floats each time)
        parts = {"train": stack[:, tr_idx].contiguous(), "test": stack[:, te_idx].contiguous()}
        del stack

        def logits(part):
            mixed = gamma * torch.einsum("l,lnd->nd", torch.softmax(w, 0), parts[part])
            return head(mixed)

        adam = _Adam(params, decay, self.lr)
        for _ in range(self.n_epochs):
            loss = torch.nn.functional.cross_entropy(logits("train"), yt[tr_idx])
            adam.step(torch.autograd.grad(loss, params))
        with torch.no_grad():
            acc = float((logits("test").argmax(1) == yt[te_idx]).float().mean())
            tr_acc = float((logits("train").argmax(1) == yt[tr_idx]).float().mean())
            weights = torch.softmax(w, 0).cpu().numpy().astype(np.float64)
        layers = np.arange(n_layers) if self.layers is None else np.asarray(self.layers)
        self.classes_ = classes
        self.result_ = ScalarMixResult(layers, weights, float(gamma.detach()), acc, tr_acc)
        self.weights_, self.gamma_, self.accuracy_ = weights, float(gamma.detach()), acc
        return self


class _Adam:
    """Plain Adam (Kingma & Ba 2015) with L2 weight decay per parameter. Written out because
    constructing ``torch.optim.Adam`` imports torch._dynamo, which costs seconds per process."""

    def __init__(self, params, decay, lr, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.decay, self.lr, self.betas, self.eps = params, decay, lr, betas, eps
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    @torch.no_grad()
    def step(self, grads):
        self.t += 1
        b1, b2 = self.betas
        for p, g, m, v, wd in zip(self.params, grads, self.m, self.v, self.decay):
            if wd:
                g = g + wd * p
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            mhat = m / (1 - b1 ** self.t)
            vhat = v / (1 - b2 ** self.t)
            p.sub_(self.lr * mhat / (vhat.sqrt() + self.eps))
