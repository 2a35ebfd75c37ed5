"""Per-layer linear probes with a control task (Hewitt & Liang 2019, "Designing and Interpreting
Probes with Control Tasks").

A probe's accuracy alone says little: a flexible probe can memorise word identity. The control
task gives every word type a random label drawn from the empirical label distribution (the same
label for all its occurrences); a probe that scores well on it is memorising. Selectivity =
accuracy on the real task − accuracy on the control task, both cross-validated with the same
probe and hyper-parameters: ``control_strength="shared"`` (the default, as Hewitt & Liang compare one
probe configuration on both tasks) fits the control task with the regularisation strength the real
task chose in the same fold; ``"per_task"`` lets the control task choose its own (a named variant: a
strength tuned to the control task memorises better, so its selectivity is lower).

``kind="logistic"``: L2 logistic regression, the inverse strength C picked per training fold on a
held-out part of it; ``kind="ridge"``: ridge classifier (or ridge regression for real-valued
labels, scored by R²) with the strength picked by exact leave-one-out error (``probes.ridge_cv``,
the estimator of scikit-learn's ``RidgeClassifierCV`` / ``RidgeCV``, in torch).
Features are standardised with the training fold's statistics.

Axes: X is (layer, token, d_model) or a sequence of (token, d_model); labels, word_types and groups
are (token,). Results are per layer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold, KFold, StratifiedGroupKFold, StratifiedKFold, train_test_split
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from lens.runtime.threads import serial
from probes._common import as_numpy_1d, get_layer, layer_count
from probes.ridge_cv import RidgeLOO

__all__ = ["LinearProbe", "ProbeResult", "control_labels", "char_labels", "CONTROL_STRENGTHS"]
CONTROL_STRENGTHS = ("shared", "per_task")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeResult:
    """Cross-validated probe scores per layer; arrays are (layer,).

    metric: "accuracy" (classification) or "r2" (ridge regression); accuracy / accuracy_std: mean and
    standard deviation over folds of the real task; control_accuracy: the same on the control task
    (NaN when no control was run); selectivity = accuracy − control_accuracy; regularization: the
    strength chosen on the last fold (C for logistic, alpha for ridge); majority: score of always
    predicting the most frequent training label (classification); best_layer: label of the layer
    with the highest accuracy; correct / control_correct (layer, token): 1 where the held-out prediction of
    the real task was right / the share of the control draws whose held-out prediction was right, out of fold
    (classification; NaN for a regression or no control), so an interval can resample whole groups of tokens;
    control_draw_accuracy (draw, layer): each control draw's out-of-fold accuracy. With several control draws
    (``n_control_draws``) control_accuracy is their mean: one draw's random labels for the few most frequent
    types move it by several points.
    """

    layers: np.ndarray
    metric: str
    accuracy: np.ndarray
    accuracy_std: np.ndarray
    control_accuracy: np.ndarray
    selectivity: np.ndarray
    regularization: np.ndarray
    majority: float
    best_layer: int
    correct: np.ndarray | None = None
    control_correct: np.ndarray | None = None
    control_draw_accuracy: np.ndarray | None = None


def control_labels(labels, word_types, seed: int = 0) -> np.ndarray:
    """Hewitt & Liang's control task: one random label per word type, drawn from the empirical
    label distribution, shared by all its occurrences. Returns an array (token,)."""
    labels = as_numpy_1d(labels, "labels")
    types = as_numpy_1d(word_types, "word_types", len(labels))
    uniq_types, type_idx = np.unique(types, return_inverse=True)
    rng = np.random.default_rng(seed)
    per_type = labels[rng.integers(0, len(labels), size=len(uniq_types))]
    return per_type[type_idx]


def char_labels(tokens, letter: str, markers=("Ġ", "▁", "##", "Ċ")) -> np.ndarray:
    """Character probe labels (token,): does the token's text contain ``letter`` (case-insensitive)?

    Tokenizer word-boundary markers (GPT-2 / Llama-BPE's Ġ and Ċ, SentencePiece's ▁, WordPiece's ##)
    are removed first so that they never count as characters of the token.
    """
    if not isinstance(letter, str) or len(letter) != 1:
        raise ValueError(f"letter: expected a single character, got {letter!r}")
    low = letter.lower()
    out = np.empty(len(tokens), dtype=bool)
    for i, t in enumerate(tokens):
        if not isinstance(t, str):
            raise ValueError(f"tokens[{i}]: expected a string, got {type(t).__name__}")
        for m in markers:
            t = t.replace(m, "")
        out[i] = low in t.lower()
    return out


class LinearProbe:
    """Cross-validated linear probe for every layer, with an optional control task.

    ``LinearProbe(kind="logistic").fit(X, labels, word_types=token_ids, groups=doc_ids)``: folds are
    grouped by ``groups`` when given (so a document never sits on both sides); the control task
    needs ``word_types``. Fitted attributes: ``result_``, ``accuracy_``, ``selectivity_``.
    """

    def __init__(self, kind: str = "logistic", Cs=(0.01, 0.1, 1.0, 10.0), alphas=(0.1, 1.0, 10.0, 100.0, 1000.0),
                 n_folds: int = 5, control: bool = True, max_iter: int = 500, seed: int = 0, layers=None,
                 progress: bool = False, control_strength: str = "shared", n_control_draws: int = 1):
        self.kind = kind
        self.Cs = Cs
        self.alphas = alphas
        self.n_folds = n_folds
        self.control = control
        self.max_iter = max_iter
        self.seed = seed
        self.layers = layers
        self.progress = progress
        self.control_strength = control_strength
        self.n_control_draws = n_control_draws

    def _check(self, X, labels, word_types, groups):
        if self.kind not in ("logistic", "ridge"):
            raise ValueError(f"kind: expected 'logistic' or 'ridge', got {self.kind!r}")
        if self.control_strength not in CONTROL_STRENGTHS:
            raise ValueError(f"control_strength: expected one of {CONTROL_STRENGTHS}, got {self.control_strength!r}")
        if not isinstance(self.n_control_draws, int) or self.n_control_draws < 1:
            raise ValueError(f"n_control_draws: expected a positive integer, got {self.n_control_draws!r}")
        if self.n_folds < 2:
            raise ValueError(f"n_folds: expected at least 2, got {self.n_folds}")
        n_layers = layer_count(X)
        x0 = get_layer(X, 0)
        n = int(x0.shape[0])
        y = as_numpy_1d(labels, "labels", n)
        self.regression_ = self.kind == "ridge" and np.issubdtype(y.dtype, np.floating)
        if not self.regression_:
            classes, counts = np.unique(y, return_counts=True)
            if len(classes) < 2:
                raise ValueError(f"labels: expected at least 2 classes, got {len(classes)} ({classes[:3]})")
            if counts.min() < self.n_folds and groups is None:
                log.warning("labels: the rarest class has %d tokens, fewer than n_folds=%d",
                            counts.min(), self.n_folds)
        elif not np.all(np.isfinite(y)):
            raise ValueError("labels: expected finite values for a ridge regression probe, got NaN/inf")
        if n < 2 * self.n_folds:
            raise ValueError(f"X: expected at least {2 * self.n_folds} tokens for {self.n_folds}-fold CV, got {n}")
        wt = None if word_types is None else as_numpy_1d(word_types, "word_types", n)
        if self.control and wt is None:
            raise ValueError("word_types: expected one word type (e.g. token id) per token for the control "
                             "task, got None (pass control=False to skip it)")
        g = None if groups is None else as_numpy_1d(groups, "groups", n)
        if g is not None and len(np.unique(g)) < self.n_folds:
            raise ValueError(f"groups: expected at least n_folds={self.n_folds} distinct groups, "
                             f"got {len(np.unique(g))}")
        return n_layers, n, y, wt, g

    def _folds(self, n, y, g):
        if self.regression_:
            cv = GroupKFold(self.n_folds) if g is not None else KFold(self.n_folds, shuffle=True,
                                                                        random_state=self.seed)
            return list(cv.split(np.zeros(n), y, g))
        if g is not None:
            cv = StratifiedGroupKFold(self.n_folds, shuffle=True, random_state=self.seed)
        else:
            cv = StratifiedKFold(self.n_folds, shuffle=True, random_state=self.seed)
        return list(cv.split(np.zeros(n), y, g))

    def _score_fold(self, Xtr, ytrs, Xte, ytes, share: bool):
        """(score, chosen strength, per-test-token correctness or None) of one fold for each task (label vector)
        in ``ytrs``/``ytes``; ``share``: the first task chooses the strength and the others are fitted with it.

        The tasks share the fold's features: standardised once, and for ridge one decomposition
        of the training matrix (``RidgeLOO.fit_many``); each task's result is what fitting it alone
        (with that strength) gives, to the bit."""
        scaler = StandardScaler().fit(Xtr)
        Xtr, Xte = scaler.transform(Xtr), scaler.transform(Xte)
        if self.kind == "ridge":
            models = RidgeLOO(alphas=self.alphas, classification=not self.regression_).fit_many(Xtr, ytrs, share)
            with serial():                  # (test rows × d) @ (d × 1): contended threads only spin
                return [(float(m.score(Xte, yte)), float(m.alpha_),
                         None if self.regression_ else (m.predict(Xte) == yte).astype(np.float64))
                        for m, yte in zip(models, ytes)]
        with threadpool_limits(1):          # small LAPACK/BLAS calls: contended threads only spin
            out = [self._logistic_fold(Xtr, ytrs[0], Xte, ytes[0])]
            for ytr, yte in zip(ytrs[1:], ytes[1:]):
                out.append(self._logistic_fold(Xtr, ytr, Xte, yte, out[0][1] if share else None))
            return out

    def _logistic_fold(self, Xtr, ytr, Xte, yte, c: float | None = None):
        """(test accuracy, C) of an L2 logistic regression: C as given, or picked on a held-out part."""
        best_c = self.Cs[0] if c is None else c
        if c is None and len(self.Cs) > 1:
            strat = ytr if np.unique(ytr, return_counts=True)[1].min() >= 2 else None
            a, b, ya, yb = train_test_split(Xtr, ytr, test_size=0.25, random_state=self.seed, stratify=strat)
            if len(np.unique(ya)) > 1:
                scores = [LogisticRegression(C=c, max_iter=self.max_iter).fit(a, ya).score(b, yb) for c in self.Cs]
                best_c = self.Cs[int(np.argmax(scores))]
        model = LogisticRegression(C=best_c, max_iter=self.max_iter).fit(Xtr, ytr)
        return float(model.score(Xte, yte)), float(best_c), (model.predict(Xte) == yte).astype(np.float64)

    def _cv(self, X, ys, folds):
        """Cross-validated (mean, std, last chosen strength) of each task in ``ys`` on features X, and the
        out-of-fold correctness (task, token) of each held-out prediction (NaN for a regression)."""
        scores = [[] for _ in ys]
        reg = [np.nan] * len(ys)
        oof = np.full((len(ys), len(ys[0])), np.nan)
        for tr, te in folds:
            fit = []
            for t, y in enumerate(ys):
                if not self.regression_ and len(np.unique(y[tr])) < 2:
                    scores[t].append(float(np.mean(y[te] == y[tr][0])))
                    oof[t, te] = y[te] == y[tr][0]
                else:
                    fit.append(t)
            if not fit:
                continue
            # the control task takes the real task's strength when it was fitted in this fold
            share = self.control_strength == "shared" and fit[0] == 0
            for t, (s, r, ok) in zip(fit, self._score_fold(X[tr], [ys[t][tr] for t in fit], X[te],
                                                           [ys[t][te] for t in fit], share)):
                scores[t].append(s)
                reg[t] = r
                if ok is not None:
                    oof[t, te] = ok
        return [(float(np.mean(s)), float(np.std(s)), r) for s, r in zip(scores, reg)], oof

    def fit(self, X, labels, word_types=None, groups=None) -> "LinearProbe":
        n_layers, n, y, wt, g = self._check(X, labels, word_types, groups)
        folds = self._folds(n, y, g)
        # draw j is seeded seed + j: one draw is the control task of seed, as before there were several
        ycs = [control_labels(y, wt, self.seed + j) for j in range(self.n_control_draws)] if self.control else []
        draws = np.full((len(ycs), n_layers), np.nan)
        acc, sd, ctl, reg = (np.full(n_layers, np.nan) for _ in range(4))
        correct, control_correct = (np.full((n_layers, n), np.nan) for _ in range(2))
        d = None
        for i in tqdm(range(n_layers), desc="linear probe", unit="layer", disable=not self.progress):
            t = get_layer(X, i, n)
            d = d or int(t.shape[1])
            if t.shape[1] != d:
                raise ValueError(f"X[{i}]: expected d_model {d} like layer 0, got {t.shape[1]}")
            xi = t.detach().cpu().float().numpy() if hasattr(t, "detach") else np.asarray(t, np.float32)
            if not np.all(np.isfinite(xi)):
                raise ValueError(f"X[{i}]: expected finite values, got NaN/inf")
            res, oof = self._cv(xi, [y, *ycs], folds)
            acc[i], sd[i], reg[i] = res[0]
            correct[i] = oof[0]
            if ycs:
                ctl[i] = float(np.mean([r[0] for r in res[1:]]))
                control_correct[i] = oof[1:].mean(axis=0)
                if not self.regression_:
                    draws[:, i] = oof[1:].mean(axis=1)
        if self.regression_:
            majority = 0.0
        else:
            majority = float(np.mean([np.mean(y[te] == _mode(y[tr])) for tr, te in folds]))
        layers = np.arange(n_layers) if self.layers is None else np.asarray(self.layers)
        self.result_ = ProbeResult(layers=layers, metric="r2" if self.regression_ else "accuracy",
                                   accuracy=acc, accuracy_std=sd, control_accuracy=ctl,
                                   selectivity=acc - ctl, regularization=reg, majority=majority,
                                   best_layer=int(layers[int(np.nanargmax(acc))]),
                                   correct=correct, control_correct=control_correct,
                                   control_draw_accuracy=draws if ycs else None)
        self.accuracy_, self.selectivity_ = acc, acc - ctl
        return self


def _mode(a: np.ndarray):
    vals, counts = np.unique(a, return_counts=True)
    return vals[int(np.argmax(counts))]
