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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from geometry.arrays import lapack_threads

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

    n: token count; s: Σx (d,); S: Σxxᵀ (d, d); R: per-class Σx (d, C); counts: per-class token
    count (C,); rt, st, stt: Σx·t (d,), Σt, Σt² for a scalar target t (the token id).
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
        return cls(0.0, torch.zeros(d, **z), torch.zeros(d, d, **z), torch.zeros(d, n_classes, **z),
                   torch.zeros(n_classes, **z), torch.zeros(d, **z), 0.0, 0.0)

    def add_rows(self, x: torch.Tensor, cls_idx: torch.Tensor, target: torch.Tensor) -> None:
        """Accumulate float64 rows ``x`` (token, d) with class indices and scalar targets."""
        self.n += float(x.shape[0])
        self.s += x.sum(0)
        self.S.addmm_(x.T, x)
        self.R.index_add_(1, cls_idx, x.T)
        self.counts.index_add_(0, cls_idx, torch.ones_like(cls_idx, dtype=F64))
        self.rt += x.T @ target
        self.st += float(target.sum())
        self.stt += float((target * target).sum())

    def __add__(self, o: "Moments") -> "Moments":
        return Moments(self.n + o.n, self.s + o.s, self.S + o.S, self.R + o.R, self.counts + o.counts,
                       self.rt + o.rt, self.st + o.st, self.stt + o.stt)

    def centred(self, mu: torch.Tensor):
        """Gram, per-class sums and column sums of the rows centred at ``mu``: (G, B, u)."""
        G = self.S - torch.outer(self.s, mu) - torch.outer(mu, self.s) + self.n * torch.outer(mu, mu)
        B = self.R - torch.outer(mu, self.counts)
        u = self.s - self.n * mu
        return G, B, u

    def target_ss(self) -> float:
        """Σ‖y − ȳ‖² of this set's one-hot targets about their own mean: N − Σ n_c²/N."""
        return self.n - float((self.counts * self.counts).sum()) / self.n


@dataclass
class RidgeFit:
    """A ridge fit in the eigenbasis of the training Gram (all float64).

    mu (d,): training mean; p (C,): training class frequencies (the intercept); Q (d, d), ev (d,):
    eigenvectors / eigenvalues of the centred training Gram; Bt (d, C) = QᵀB; M (d, d) = Bt Btᵀ;
    bp (d,) = Bt p; mean_ev: tr(G)/d, the scale relative ridge strengths multiply.
    """

    mu: torch.Tensor
    p: torch.Tensor
    Q: torch.Tensor
    ev: torch.Tensor
    Bt: torch.Tensor
    M: torch.Tensor
    bp: torch.Tensor
    mean_ev: float
    train: Moments

    def weights(self, lam: float) -> torch.Tensor:
        """Explicit W (d, C) for ridge strength ``lam`` (absolute)."""
        D = 1.0 / (self.ev + lam)
        return self.Q @ (D[:, None] * self.Bt)


def fit_moments(m: Moments) -> RidgeFit:
    """Prepare the ridge fit of one-hot targets on the token set summarised by ``m``."""
    if m.n < 2:
        raise ValueError(f"ridge fit: expected at least 2 training tokens, got {int(m.n)}")
    mu = m.s / m.n
    G, B, _ = m.centred(mu)
    ev, Q = eigh(G)
    # columns of classes absent from this set are exactly zero (no rows, zero count): skip them
    cols = torch.nonzero(m.counts > 0).squeeze(1)
    Bt = torch.zeros_like(B)
    Bt_nz = Q.T @ B[:, cols]
    Bt[:, cols] = Bt_nz
    p = m.counts / m.n
    return RidgeFit(mu=mu, p=p, Q=Q, ev=ev, Bt=Bt, M=Bt_nz @ Bt_nz.T, bp=Bt_nz @ p[cols],
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
        a = torch.diagonal(fit.M)
        base = m.n * (1.0 - float(p @ p))
        return base - 2.0 * (D @ a) + (D * D) @ (fit.ev * a)
    G, B, u = m.centred(fit.mu)
    Gt = fit.Q.T @ G @ fit.Q
    cols = torch.nonzero(m.counts > 0).squeeze(1)           # B's other columns are zero
    a = (fit.Bt[:, cols] * (fit.Q.T @ B[:, cols])).sum(1)   # diag(Bt Beᵀ) in the eigenbasis
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
        D = 1.0 / (fit.ev + lam)
        # columns of W only for the classes scored (``needed`` in the cache, else all of them)
        needed = cache.get("needed")
        if needed is None:
            needed = torch.arange(fit.Bt.shape[1], device=fit.Bt.device)
        slot = torch.full((fit.Bt.shape[1],), -1, dtype=torch.long, device=fit.Bt.device)
        slot[needed] = torch.arange(len(needed), device=fit.Bt.device)
        cache["slot"] = slot
        cache["Wt"] = (fit.Q @ (D[:, None] * fit.Bt[:, needed])).T.contiguous()   # (class, d): rows gather fast
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


def scalar_in_sample_rss(m: Moments, lam: float) -> tuple[float, float]:
    """In-sample ridge fit of the scalar target t on x: returns (RSS, Σ(t − t̄)²)."""
    mu = m.s / m.n
    G = m.S - m.n * torch.outer(mu, mu)
    b = m.rt - mu * m.st
    tss = m.stt - m.st * m.st / m.n
    ev, Q = eigh(G)
    bt = Q.T @ b
    D = 1.0 / (ev + lam)
    rss_value = tss - float((bt * bt * (2.0 * D - ev * D * D)).sum())
    return rss_value, tss
