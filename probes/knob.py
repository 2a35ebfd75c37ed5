"""Per-layer direction separating two conditions — the "knob" of Minder et al. (2025, "Controllable
Context Sensitivity and the Knob Behind It": a 1-D subspace in one layer decides whether the model
answers from the context or from its prior knowledge).

For each layer two directions are fitted: the difference of class means (unit vector; the
mean-difference probe that steering papers use) and an L2 logistic probe's weight vector.
Separation is measured out of sample by K-fold cross-validation: the accuracy of thresholding the
projection on the difference-of-means direction at the midpoint of the two training means
(``separation``), the logistic probe's accuracy, and d' = |m1 − m0| / pooled sd of the projections.
The best layer maximises ``separation`` (ties: larger d'). Directions and the class means of the
projections are refit on all data, for steering (set a state's coordinate along the direction).

Axes: X (layer, example, d_model) or a sequence of (example, d_model); condition (example,) with two
values (condition 1 is the second in sorted order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from threadpoolctl import threadpool_limits

from probes._common import as_numpy_1d, get_layer, layer_count

__all__ = ["KnobProbe", "KnobResult"]


@dataclass(frozen=True)
class KnobResult:
    """layers (layer,); separation (layer,): CV accuracy of the difference-of-means direction;
    logistic_accuracy (layer,); dprime (layer,); direction (layer, d_model): unit difference-of-means
    direction (from condition 0 towards 1); logistic_direction (layer, d_model): unit logistic weights;
    cosine (layer,): cosine between the two; proj_mean (layer, 2): mean projection of each condition
    on ``direction``; conditions (2,): the two condition values; best_layer: label of the best layer."""

    layers: np.ndarray
    separation: np.ndarray
    logistic_accuracy: np.ndarray
    dprime: np.ndarray
    direction: np.ndarray
    logistic_direction: np.ndarray
    cosine: np.ndarray
    proj_mean: np.ndarray
    conditions: np.ndarray
    best_layer: int


def _unit(v: np.ndarray) -> np.ndarray:
    nrm = np.linalg.norm(v)
    return v / nrm if nrm > 0 else v


class KnobProbe:
    """``KnobProbe().fit(X, condition)``; fitted ``result_``, ``best_layer_``, ``direction_`` (best layer).

    ``logistic=False`` skips the logistic probe (its accuracy, direction and cosine are NaN): the best
    layer, the direction and the projection means do not depend on it, and it is most of the fit's time."""

    def __init__(self, n_folds: int = 5, C: float = 1.0, max_iter: int = 1000, seed: int = 0, layers=None,
                 logistic: bool = True):
        self.n_folds = n_folds
        self.logistic = logistic
        self.C = C
        self.max_iter = max_iter
        self.seed = seed
        self.layers = layers

    def fit(self, X, condition) -> "KnobProbe":
        with threadpool_limits(1):          # small BLAS calls: contended threads only spin
            return self._fit(X, condition)

    def _fit(self, X, condition) -> "KnobProbe":
        n_layers = layer_count(X)
        x0 = get_layer(X, 0)
        n, d = int(x0.shape[0]), int(x0.shape[1])
        c_raw = as_numpy_1d(condition, "condition", n)
        conds, y = np.unique(c_raw, return_inverse=True)
        if len(conds) != 2:
            raise ValueError(f"condition: expected exactly 2 distinct values, got {len(conds)} ({conds[:5]})")
        if np.bincount(y).min() < self.n_folds:
            raise ValueError(f"condition: expected at least n_folds={self.n_folds} examples of each condition, "
                             f"got {np.bincount(y).tolist()}")
        folds = list(StratifiedKFold(self.n_folds, shuffle=True, random_state=self.seed).split(np.zeros(n), y))
        sep, logi, dp, cos = (np.zeros(n_layers) for _ in range(4))
        dirs, ldirs, pm = np.zeros((n_layers, d)), np.zeros((n_layers, d)), np.zeros((n_layers, 2))
        for i in range(n_layers):
            t = x0 if i == 0 else get_layer(X, i, n, d)
            x = t.detach().cpu().double().numpy()
            if not np.all(np.isfinite(x)):
                raise ValueError(f"X[{i}]: expected finite values, got NaN/inf")
            hits_dm, hits_lr, proj_oof = 0, 0, np.zeros(n)
            for tr, te in folds:
                m0, m1 = x[tr][y[tr] == 0].mean(0), x[tr][y[tr] == 1].mean(0)
                u = _unit(m1 - m0)
                thr = 0.5 * (m0 + m1) @ u
                proj_oof[te] = x[te] @ u - thr
                hits_dm += int(((proj_oof[te] > 0).astype(int) == y[te]).sum())
                if self.logistic:
                    lr = LogisticRegression(C=self.C, max_iter=self.max_iter).fit(x[tr], y[tr])
                    hits_lr += int((lr.predict(x[te]) == y[te]).sum())
            sep[i], logi[i] = hits_dm / n, (hits_lr / n if self.logistic else np.nan)
            a, b = proj_oof[y == 0], proj_oof[y == 1]
            pooled = np.sqrt(0.5 * (a.var(ddof=1) + b.var(ddof=1)))
            dp[i] = abs(b.mean() - a.mean()) / pooled if pooled > 0 else np.inf
            m0, m1 = x[y == 0].mean(0), x[y == 1].mean(0)
            dirs[i] = _unit(m1 - m0)
            if self.logistic:
                ldirs[i] = _unit(LogisticRegression(C=self.C, max_iter=self.max_iter).fit(x, y).coef_[0])
                cos[i] = float(dirs[i] @ ldirs[i])
            else:
                ldirs[i], cos[i] = np.nan, np.nan
            pm[i] = [m0 @ dirs[i], m1 @ dirs[i]]
        layers = np.arange(n_layers) if self.layers is None else np.asarray(self.layers)
        best = int(np.lexsort((dp, sep))[-1])
        self.result_ = KnobResult(layers, sep, logi, dp, dirs, ldirs, cos, pm, conds, int(layers[best]))
        self.best_layer_ = int(layers[best])
        self.direction_ = dirs[best]
        return self
