"""Closed-form ridge regression onto one-hot class targets, from sufficient statistics.

The prediction residual of He & Su (2024) regresses one-hot next-token targets Y (token, vocab) on
token states X (token, d_model). Y is never built: with C classes,

* XᵀY (d_model, C) is a per-class sum of rows of X (``index_add``),
* ‖Y‖² = N, and the column sums of Y are the class counts,

so the ridge solution W = (XcᵀXc + λI)⁻¹ XcᵀY (X centred; the intercept is not penalised, as in
scikit-learn's ``Ridge(fit_intercept=True)``) and the residual sum of squares on any token set
follow from the moments n, Σx, ΣxxᵀT, per-class sums R and class counts of the fitting set and of
the evaluation set. Writing the fit in the eigenbasis of the centred Gram G = QΛQᵀ turns every λ of
a grid into O(d²) work:

    RSS_e(λ) = Σ_e‖y − p‖² − 2[tr(WᵀB_e) − u_eᵀWp] + tr(G_e WWᵀ),    W = Q D Bt,  D = (Λ + λ)⁻¹

with p the training class frequencies (the fitted intercept), B_e, G_e, u_e the evaluation set's
per-class sums, Gram and column sums centred at the training mean, and Bt = QᵀB.

Axes: ``d`` = d_model, ``C`` = compact class table (the distinct next-token ids of the data).
Everything is accumulated in float64 on the device of the input; rows are shifted by a reference
mean before accumulation to limit cancellation in the uncentred sums.

Work only where it counts: per-class sums are stored one row per class (``R`` is (C, d), so adding
a chunk of rows is a contiguous row scatter); a set's centred class sums are formed for the
classes it contains only (a validation or test set holds a fraction of C); ``Bt`` keeps the fitting
set's classes only (the other columns of QᵀB are exactly zero); and a fit used in-sample only
(``fit_moments(m, in_sample_only=True)``) skips M = Bt Btᵀ, whose diagonal is all it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from geometry.arrays import lapack_threads
from lens.runtime.threads import serial

__all__ = ["Moments", "RidgeFit", "fit_moments", "rss", "token_residuals", "scalar_in_sample_rss"]

F64 = torch.float64




def eigh(G: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (clamped at 0) and eigenvectors of the symmetric part of a Gram matrix."""
    with lapack_threads(G.device):  # one thread: contended multi-threaded LAPACK spin-waits
        ev, Q = torch.linalg.eigh(0.5 * (G + G.T))
    return ev.clamp_min(0.0), Q


@dataclass
class Moments:
    """Uncentred sufficient statistics of one token set (rows shifted by a common reference).

    n: token count; s: Σx (d,); S: Σxxᵀ (d, d); R: per-class Σx, one row per class (C, d); counts:
    per-class token count (C,); rt, st, stt: Σx·t (d,), Σt, Σt² for a scalar target t (the token id).
    """

    n: float
    s: torch.Tensor
    S: torch.Tensor
    R: torch.Tensor
    counts: torch.Tensor
    rt: torch.Tensor
    st: float
    stt: float

    @classmethod
    def zeros(cls, d: int, n_classes: int, device) -> "Moments":
        z = dict(dtype=F64, device=device)
        return cls(0.0, torch.zeros(d, **z), torch.zeros(d, d, **z), torch.zeros(n_classes, d, **z),
                   torch.zeros(n_classes, **z), torch.zeros(d, **z), 0.0, 0.0)

    def add_rows(self, x: torch.Tensor, cls_idx: torch.Tensor, target: torch.Tensor) -> None:
        """Accumulate float64 rows ``x`` (token, d) with class indices and scalar targets."""
        self.n += float(x.shape[0])
        self.s += x.sum(0)
        self.S.addmm_(x.T, x)
        with serial(x.device):  # one scatter per row: on contended threads each is a fork/join (16x slower)
            self.R.index_add_(0, cls_idx, x)
        self.counts.index_add_(0, cls_idx, torch.ones_like(cls_idx, dtype=F64))
        self.rt += x.T @ target
        self.st += float(target.sum())
        self.stt += float((target * target).sum())

    def __add__(self, o: "Moments") -> "Moments":
        return Moments(self.n + o.n, self.s + o.s, self.S + o.S, self.R + o.R, self.counts + o.counts,
                       self.rt + o.rt, self.st + o.st, self.stt + o.stt)

    def classes(self) -> torch.Tensor:
        """Indices of the classes with at least one token in this set (sorted)."""
        return torch.nonzero(self.counts > 0).squeeze(1)

    def centred(self, mu: torch.Tensor, cols: torch.Tensor):
        """Gram, per-class sums of the classes ``cols`` and column sums of the rows centred at
        ``mu``: (G (d, d), B (d, len(cols)), u (d,)). A class absent from the set has B = 0."""
        G = self.S - torch.outer(self.s, mu) - torch.outer(mu, self.s) + self.n * torch.outer(mu, mu)
        B = (self.R[cols] - torch.outer(self.counts[cols], mu)).T
        u = self.s - self.n * mu
        return G, B, u

    def target_ss(self) -> float:
        """Σ‖y − ȳ‖² of this set's one-hot targets about their own mean: N − Σ n_c²/N."""
        return self.n - float((self.counts * self.counts).sum()) / self.n


@dataclass
class RidgeFit:
    """A ridge fit in the eigenbasis of the training Gram (all float64).

    mu (d,): training mean; p (C,): training class frequencies (the intercept); Q (d, d), ev (d,):
    eigenvectors / eigenvalues of the centred training Gram; cols: the training set's classes;
    Bt (d, len(cols)) = QᵀB over those classes (QᵀB is zero for the others); M (d, d) = Bt Btᵀ
    (None for an in-sample-only fit); m_diag (d,): diag(M); bp (d,) = Bt p; mean_ev: tr(G)/d, the
    scale relative ridge strengths multiply.
    """

    mu: torch.Tensor
    p: torch.Tensor
    Q: torch.Tensor
    ev: torch.Tensor
    cols: torch.Tensor
    Bt: torch.Tensor
    M: torch.Tensor | None
    m_diag: torch.Tensor
    bp: torch.Tensor
    mean_ev: float
    train: Moments

    def bt_columns(self, classes: torch.Tensor) -> torch.Tensor:
        """QᵀB for the given class indices (d, len(classes)); zero columns for classes not trained on."""
        slot = torch.full((self.p.shape[0],), -1, dtype=torch.long, device=self.Bt.device)
        slot[self.cols] = torch.arange(len(self.cols), device=self.Bt.device)
        pos = slot[classes]
        out = torch.zeros(self.Bt.shape[0], len(classes), dtype=self.Bt.dtype, device=self.Bt.device)
        have = pos >= 0
        out[:, have] = self.Bt[:, pos[have]]
        return out

    def weights(self, lam: float) -> torch.Tensor:
        """Explicit W (d, C) for ridge strength ``lam`` (absolute)."""
        D = 1.0 / (self.ev + lam)
        return self.Q @ (D[:, None] * self.bt_columns(torch.arange(self.p.shape[0], device=self.Bt.device)))


def fit_moments(m: Moments, in_sample_only: bool = False) -> RidgeFit:
    """Prepare the ridge fit of one-hot targets on the token set summarised by ``m``.

    ``in_sample_only``: the fit will only be scored on ``m`` itself (:func:`rss` with ``m``), which
    needs diag(M) alone: M is not formed (d² · C work saved)."""
    if m.n < 2:
        raise ValueError(f"ridge fit: expected at least 2 training tokens, got {int(m.n)}")
    mu = m.s / m.n
    # columns of classes absent from this set are exactly zero (no rows, zero count): skip them
    cols = m.classes()
    G, B, _ = m.centred(mu, cols)
    ev, Q = eigh(G)
    Bt = Q.T @ B
    p = m.counts / m.n
    M = None if in_sample_only else Bt @ Bt.T
    m_diag = (Bt * Bt).sum(1) if M is None else torch.diagonal(M)
    return RidgeFit(mu=mu, p=p, Q=Q, ev=ev, cols=cols, Bt=Bt, M=M, m_diag=m_diag, bp=Bt @ p[cols],
                    mean_ev=float(ev.sum()) / ev.numel(), train=m)


def rss(fit: RidgeFit, m: Moments, lams: torch.Tensor) -> torch.Tensor:
    """Residual sum of squares of the one-hot targets of set ``m`` for each ridge strength in ``lams``.

    Targets are centred by the fitted intercept p; see the module docstring for the formula.
    Returns a (len(lams),) float64 tensor.
    """
    lams = torch.as_tensor(lams, dtype=F64, device=fit.ev.device).reshape(-1)
    if bool((lams <= 0).any()):
        raise ValueError(f"ridge strengths: expected positive values, got {lams.tolist()}")
    D = 1.0 / (fit.ev[None, :] + lams[:, None])              # (K, d)
    p = fit.p
    if m is fit.train:                                       # in-sample: Gt = Λ, QᵀB = Bt, u = 0
        a = fit.m_diag
        base = m.n * (1.0 - float(p @ p))
        return base - 2.0 * (D @ a) + (D * D) @ (fit.ev * a)
    if fit.M is None:
        raise ValueError("rss: this fit was prepared in-sample only (fit_moments(in_sample_only=True)); "
                         "score it on its own training moments")
    cols = m.classes()                                       # B's other columns are zero
    G, B, u = m.centred(fit.mu, cols)
    Gt = fit.Q.T @ G @ fit.Q
    a = (fit.bt_columns(cols) * (fit.Q.T @ B)).sum(1)        # diag(Bt Beᵀ) in the eigenbasis
    ut = fit.Q.T @ u
    base = m.n - 2.0 * float(m.counts @ p) + m.n * float(p @ p)
    cross = D @ a - D @ (ut * fit.bp)
    quad = ((D @ (Gt * fit.M)) * D).sum(1)
    return base - 2.0 * cross + quad


def token_residuals(fit: RidgeFit, lam: float, x: torch.Tensor, cls_idx: torch.Tensor,
                    cache: dict | None = None) -> torch.Tensor:
    """Per-token squared residual ‖e_y − p − Wᵀ(x − mu)‖² for float64 rows ``x`` (token, d).

    Costs O(token · d²): Wᵀx is never formed over the classes; only the true class's column of W
    and the quadratic form with K = WWᵀ are needed. ``cache`` (a dict) keeps W and K between chunks;
    put the class indices that will be scored under ``cache["needed"]`` to build only those columns.
    """
    if cache is None:
        cache = {}
    if "Wt" not in cache:
        if fit.M is None:
            raise ValueError("token_residuals: expected a fit prepared with M (in_sample_only=False)")
        D = 1.0 / (fit.ev + lam)
        # columns of W only for the classes scored (``needed`` in the cache, else all of them)
        n_classes = fit.p.shape[0]
        needed = cache.get("needed")
        if needed is None:
            needed = torch.arange(n_classes, device=fit.Bt.device)
        slot = torch.full((n_classes,), -1, dtype=torch.long, device=fit.Bt.device)
        slot[needed] = torch.arange(len(needed), device=fit.Bt.device)
        cache["slot"] = slot
        cache["Wt"] = (fit.Q @ (D[:, None] * fit.bt_columns(needed))).T.contiguous()   # (class, d): rows gather fast
        cache["K"] = fit.Q @ ((D[:, None] * fit.M) * D[None, :]) @ fit.Q.T
        cache["Wp"] = fit.Q @ (D * fit.bp)
        cache["pp"] = float(fit.p @ fit.p)
    Wt, K, Wp, pp = cache["Wt"], cache["K"], cache["Wp"], cache["pp"]
    cols = cache["slot"][cls_idx]
    if bool((cols < 0).any()):
        raise ValueError("token_residuals: a row's class is missing from cache['needed']")
    xc = x - fit.mu
    py = fit.p[cls_idx]
    true_col = (xc * Wt[cols]).sum(1)
    return (1.0 - 2.0 * py + pp) - 2.0 * (true_col - xc @ Wp) + ((xc @ K) * xc).sum(1)


def scalar_in_sample_rss(m: Moments, lam: float, fit: RidgeFit | None = None) -> tuple[float, float]:
    """In-sample ridge fit of the scalar target t on x: returns (RSS, Σ(t − t̄)²).

    ``fit``: a :func:`fit_moments` of the same ``m``, whose eigendecomposition of the centred Gram
    is reused (else it is computed here)."""
    mu = m.s / m.n
    b = m.rt - mu * m.st
    tss = m.stt - m.st * m.st / m.n
    if fit is None:
        ev, Q = eigh(m.S - m.n * torch.outer(mu, mu))
    elif fit.train is not m:
        raise ValueError("scalar_in_sample_rss: expected the fit of the same moments m")
    else:
        ev, Q = fit.ev, fit.Q
    bt = Q.T @ b
    D = 1.0 / (ev + lam)
    rss_value = tss - float((bt * bt * (2.0 * D - ev * D * D)).sum())
    return rss_value, tss
