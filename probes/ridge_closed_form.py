"""Closed-form ridge regression onto one-hot class targets, from sufficient statistics.

The prediction residual of He & Su (2024) regresses one-hot next-token targets Y (token, vocab) on
token states X (token, d_model). Y is never built: with C classes,

* XᵀY (d_model, C) is a per-class sum of rows of X (``index_add``),
* ‖Y‖² = N, and the column sums of Y are the class counts,

so the ridge solution W = (XcᵀXc + λI)⁻¹ XcᵀY (X centred; the intercept is not penalised, as in
scikit-learn's ``Ridge(fit_intercept=True)``) and the residual sum of squares on any token set
follow from the moments n, Σx, ΣxxᵀT, per-class sums and class counts of the fitting set and of
the evaluation set. Writing the fit in the eigenbasis of the centred Gram G = QΛQᵀ turns every λ of
a grid into O(d²) work:

    RSS_e(λ) = Σ_e‖y − p‖² − 2[tr(WᵀB_e) − u_eᵀWp] + tr(G_e WWᵀ),    W = Q D QᵀB,  D = (Λ + λ)⁻¹

with p the training class frequencies (the fitted intercept), B (d, C) the fitting set's per-class
sums centred at its mean, B_e, G_e, u_e the evaluation set's per-class sums, Gram and column sums
centred at the training mean. The class axis enters only through two d × d "class Grams",
BBᵀ = Σ_c b_c b_cᵀ (in tr(G_e WWᵀ) = tr(Qᵀ G_e Q · D QᵀBBᵀQ D)) and BB_eᵀ = Σ_c b_c b_{e,c}ᵀ (in
tr(WᵀB_e) = tr(D QᵀBB_eᵀQ)); both are summed over blocks of classes, so no (d, C) matrix is ever held
and the cost in C is one d² pass per Gram.

Axes: ``d`` = d_model, ``C`` = compact class table (the distinct next-token ids of the data).
Everything is accumulated in float64 on the device of the input; rows are shifted by a reference
mean before accumulation to limit cancellation in the uncentred sums.

Memory: a set's per-class sums are held for the classes it contains only (a validation or test set
holds a fraction of C; :meth:`Moments.zeros` takes them), and the sum of two sets (``m_tr + m_va``)
shares its parts' tables instead of copying them: at 10⁶ tokens of d_model 2048 with 5·10⁴ distinct
next tokens, a (C, d) float64 table is 0.8 GB, and the fit holds one per split, not one per set and
fit as it did.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from geometry.arrays import lapack_threads
from lens.runtime.threads import serial

__all__ = ["Moments", "RidgeFit", "fit_moments", "rss", "token_residuals", "scalar_in_sample_rss"]

F64 = torch.float64
#: classes per block when the class Grams are summed: a (block, d) float64 block is 64 MiB at d 4096
CLASS_BLOCK = 2048


def eigh(G: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (clamped at 0) and eigenvectors of the symmetric part of a Gram matrix."""
    with lapack_threads(G.device):  # one thread: contended multi-threaded LAPACK spin-waits
        ev, Q = torch.linalg.eigh(0.5 * (G + G.T))
    return ev.clamp_min(0.0), Q


def _add_gram(S: torch.Tensor, x: torch.Tensor) -> None:
    """``S += xᵀx`` in float64. On the CPU through numpy's BLAS (OpenBLAS in numpy's wheels), whose
    dgemm measured 1.75x torch's (MKL) on an AMD EPYC (a 8192 x 2048 chunk: 1.19 s against 2.08 s, side
    by side; ``benchmarks/prediction_residual.py`` prints the ratio on the CPU it runs on); the Gram is
    this probe's largest cost (token x d_model² per layer): over 2 layers of 50k tokens of d 2048 read from a
    store, the whole fit took 80 s against 92 s. The two differ by summation order only."""
    if x.device.type == "cpu" and S.is_contiguous():
        xn = x.numpy()
        S.numpy().__iadd__(xn.T @ xn)
    else:
        S.addmm_(x.T, x)


@dataclass
class ClassSums:
    """Per-class row sums for the classes ``ids`` (sorted global class indices): ``R`` (len(ids), d)."""

    ids: torch.Tensor
    R: torch.Tensor
    slot: torch.Tensor  # (C,) row of each global class in R, −1 when absent

    @classmethod
    def zeros(cls, ids: torch.Tensor, n_classes: int, d: int, device) -> "ClassSums":
        ids = torch.unique(torch.as_tensor(ids, dtype=torch.long, device=device))
        if len(ids) and (int(ids[0]) < 0 or int(ids[-1]) >= n_classes):
            raise ValueError(f"classes: expected indices in [0, {n_classes}), got {int(ids[0])}..{int(ids[-1])}")
        slot = torch.full((n_classes,), -1, dtype=torch.long, device=device)
        slot[ids] = torch.arange(len(ids), device=device)
        return cls(ids, torch.zeros(len(ids), d, dtype=F64, device=device), slot)

    def add_to(self, out: torch.Tensor, classes: torch.Tensor) -> None:
        """``out[i] += R[class i]`` for the rows of ``classes`` this table holds."""
        pos = self.slot[classes]
        have = pos >= 0
        if bool(have.all()):
            out += self.R[pos]
        elif bool(have.any()):
            out[have] += self.R[pos[have]]


@dataclass
class Moments:
    """Uncentred sufficient statistics of one token set (rows shifted by a common reference).

    n: token count; s: Σx (d,); S: Σxxᵀ (d, d); parts: per-class Σx, as tables of the classes each part
    holds (one part for a set that rows were added to, the parts of both for a sum of sets; the sums
    of a class are the sum over parts); counts: per-class token count over the whole class table
    (C,); rt, st, stt: Σx·t (d,), Σt, Σt² for a scalar target t (the token id).
    """

    n: float
    s: torch.Tensor
    S: torch.Tensor
    parts: tuple
    counts: torch.Tensor
    rt: torch.Tensor
    st: float
    stt: float

    @classmethod
    def zeros(cls, d: int, n_classes: int, device, classes=None) -> "Moments":
        """Empty moments over a table of ``n_classes`` classes; ``classes``: the class indices rows
        will be added for (their per-class sums are the only ones held; default all)."""
        z = dict(dtype=F64, device=device)
        ids = torch.arange(n_classes, device=device) if classes is None else classes
        return cls(0.0, torch.zeros(d, **z), torch.zeros(d, d, **z),
                   (ClassSums.zeros(ids, n_classes, d, device),), torch.zeros(n_classes, **z),
                   torch.zeros(d, **z), 0.0, 0.0)

    @property
    def d(self) -> int:
        return int(self.s.shape[0])

    def add_rows(self, x: torch.Tensor, cls_idx: torch.Tensor, target: torch.Tensor) -> None:
        """Accumulate float64 rows ``x`` (token, d) with class indices and scalar targets."""
        if len(self.parts) != 1:
            raise ValueError("add_rows: expected moments of one token set, got a sum of sets")
        part = self.parts[0]
        pos = part.slot[cls_idx]
        if bool((pos < 0).any()):
            raise ValueError("add_rows: a row's class is not among the classes these moments were made for")
        self.n += float(x.shape[0])
        self.s += x.sum(0)
        _add_gram(self.S, x)
        with serial(x.device):  # one scatter per row: on contended threads each is a fork/join (16x slower)
            part.R.index_add_(0, pos, x)
        self.counts.index_add_(0, cls_idx, torch.ones_like(cls_idx, dtype=F64))
        self.rt += x.T @ target
        self.st += float(target.sum())
        self.stt += float((target * target).sum())

    def __add__(self, o: "Moments") -> "Moments":
        """The moments of the union of two disjoint token sets; the per-class tables are shared, not copied."""
        return Moments(self.n + o.n, self.s + o.s, self.S + o.S, self.parts + o.parts, self.counts + o.counts,
                       self.rt + o.rt, self.st + o.st, self.stt + o.stt)

    def classes(self) -> torch.Tensor:
        """Indices of the classes with at least one token in this set (sorted)."""
        return torch.nonzero(self.counts > 0).squeeze(1)

    def class_sums(self, classes: torch.Tensor) -> torch.Tensor:
        """Per-class Σx of ``classes`` (len(classes), d); zero rows for classes with no token here."""
        out = torch.zeros(len(classes), self.d, dtype=F64, device=self.s.device)
        for part in self.parts:
            part.add_to(out, classes)
        return out

    def centred_class_rows(self, classes: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
        """Per-class sums of the rows centred at ``mu``, one row per class of ``classes``
        (len(classes), d): Σ(x − mu) = R_c − n_c mu; zero for a class with no token here."""
        out = self.class_sums(classes)
        out -= self.counts[classes][:, None] * mu[None, :]
        return out

    def gram(self, mu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gram and column sums of the rows centred at ``mu``: (G (d, d), u (d,))."""
        G = self.S - torch.outer(self.s, mu) - torch.outer(mu, self.s) + self.n * torch.outer(mu, mu)
        return G, self.s - self.n * mu

    def target_ss(self) -> float:
        """Σ‖y − ȳ‖² of this set's one-hot targets about their own mean: N − Σ n_c²/N."""
        return self.n - float((self.counts * self.counts).sum()) / self.n


def _part_product(a: ClassSums, b: ClassSums, cache: dict) -> torch.Tensor:
    """R_aᵀ R_b (d, d) over the classes both tables hold, once per pair of tables in ``cache``."""
    if (id(b), id(a)) in cache:
        return cache[id(b), id(a)].T
    key = (id(a), id(b))
    if key not in cache:
        if a is b:
            cache[key] = a.R.T @ a.R
        else:
            pos = b.slot[a.ids]
            have = pos >= 0
            cache[key] = a.R[have].T @ b.R[pos[have]]
    return cache[key]


def _class_gram_from_parts(f: Moments, mu: torch.Tensor, e: Moments | None, weights: torch.Tensor | None,
                           cache: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`class_gram` from the uncentred products of the sets' per-class tables, each pair's computed once
    in ``cache``: with R the per-class sums and n the counts, Σ_c (R_c − n_c mu)(R'_c − n'_c mu)ᵀ =
    Σ_parts R_aᵀR'_b − (Rᵀn') muᵀ − mu (R'ᵀn)ᵀ + (n·n') mu muᵀ (a class absent from a set has R = 0, n = 0 there,
    so the sum over every class is the sum over the classes both sets hold)."""
    e = f if e is None else e
    out = sum(_part_product(a, b, cache) for a in f.parts for b in e.parts)
    rf_ne = sum(a.R.T @ e.counts[a.ids] for a in f.parts)
    re_nf = rf_ne if e is f else sum(b.R.T @ f.counts[b.ids] for b in e.parts)
    out = out - torch.outer(rf_ne, mu) - torch.outer(mu, re_nf) + float(f.counts @ e.counts) * torch.outer(mu, mu)
    wsum = None
    if weights is not None:
        wsum = sum(a.R.T @ weights[a.ids] for a in f.parts) - float(f.counts @ weights) * mu
    return out, wsum


def class_gram(f: Moments, mu: torch.Tensor, e: Moments | None = None, weights: torch.Tensor | None = None,
               block: int = CLASS_BLOCK, cache: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Σ_c b_c b'_cᵀ (d, d) over classes, with b_c the per-class sums of set ``f`` and b'_c those of ``e``
    (``f`` itself when None), both centred at ``mu`` (:meth:`Moments.centred_class_rows`); summed over
    blocks of ``block`` classes, so no (d, C) matrix is held. ``weights`` (C,): also returns Σ_c w_c b_c.
    ``cache`` (a dict the caller keeps while the sets live): the same sums from the tables' uncentred
    products, each pair of tables multiplied once however many sets share it (:func:`_class_gram_from_parts`:
    a fit on train, on train + validation and on all three splits, and the cross terms between them, take six
    products of the three splits' tables instead of five over their unions)."""
    if cache is not None:
        return _class_gram_from_parts(f, mu, e, weights, cache)
    cols = f.classes()
    if e is not None:  # only classes in both sets contribute
        cols = cols[e.counts[cols] > 0]
    d = f.d
    out = torch.zeros(d, d, dtype=F64, device=mu.device)
    wsum = None if weights is None else torch.zeros(d, dtype=F64, device=mu.device)
    for start in range(0, len(cols), block):
        c = cols[start:start + block]
        b = f.centred_class_rows(c, mu)
        out.addmm_(b.T, b if e is None else e.centred_class_rows(c, mu))
        if wsum is not None:
            wsum += b.T @ weights[c]
    return out, wsum


def _diag_rotated(A: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """diag(Qᵀ A Q) without forming it."""
    return ((A @ Q) * Q).sum(0)


@dataclass
class RidgeFit:
    """A ridge fit in the eigenbasis of the training Gram (all float64).

    mu (d,): training mean; p (C,): training class frequencies (the intercept); Q (d, d), ev (d,):
    eigenvectors / eigenvalues of the centred training Gram; cols: the training set's classes;
    M (d, d) = QᵀBBᵀQ with B the training set's centred per-class sums (None for an in-sample-only
    fit); m_diag (d,): diag(M); bp (d,) = QᵀBp; mean_ev: tr(G)/d, the scale relative ridge strengths
    multiply; train: the training moments (their per-class sums give W's columns when needed).
    """

    mu: torch.Tensor
    p: torch.Tensor
    Q: torch.Tensor
    ev: torch.Tensor
    cols: torch.Tensor
    M: torch.Tensor | None
    m_diag: torch.Tensor
    bp: torch.Tensor
    mean_ev: float
    train: Moments

    def bt_columns(self, classes: torch.Tensor) -> torch.Tensor:
        """QᵀB for the given class indices (d, len(classes)); zero columns for classes not trained on."""
        return self.Q.T @ self.train.centred_class_rows(classes, self.mu).T

    def weight_rows(self, lam: float, classes: torch.Tensor) -> torch.Tensor:
        """Rows of Wᵀ for ``classes`` (len(classes), d) at ridge strength ``lam`` (absolute)."""
        D = 1.0 / (self.ev + lam)
        return ((self.train.centred_class_rows(classes, self.mu) @ self.Q) * D[None, :]) @ self.Q.T

    def weights(self, lam: float) -> torch.Tensor:
        """Explicit W (d, C) for ridge strength ``lam`` (absolute)."""
        return self.weight_rows(lam, torch.arange(self.p.shape[0], device=self.Q.device)).T


def fit_moments(m: Moments, in_sample_only: bool = False, cache: dict | None = None) -> RidgeFit:
    """Prepare the ridge fit of one-hot targets on the token set summarised by ``m``.

    ``in_sample_only``: the fit will only be scored on ``m`` itself (:func:`rss` with ``m``), which
    needs diag(M) alone: M is not kept (a later out-of-sample score is refused). ``cache``: see
    :func:`class_gram`."""
    if m.n < 2:
        raise ValueError(f"ridge fit: expected at least 2 training tokens, got {int(m.n)}")
    mu = m.s / m.n
    G, _ = m.gram(mu)
    ev, Q = eigh(G)
    del G
    p = m.counts / m.n
    BB, Bp = class_gram(m, mu, weights=p, cache=cache)
    if in_sample_only:
        M, m_diag = None, _diag_rotated(BB, Q)
    else:
        M = Q.T @ BB @ Q
        M = 0.5 * (M + M.T)
        m_diag = torch.diagonal(M).clone()
    return RidgeFit(mu=mu, p=p, Q=Q, ev=ev, cols=m.classes(), M=M, m_diag=m_diag, bp=Q.T @ Bp,
                    mean_ev=float(ev.sum()) / ev.numel(), train=m)


def rss(fit: RidgeFit, m: Moments, lams: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
    """Residual sum of squares of the one-hot targets of set ``m`` for each ridge strength in ``lams``.

    Targets are centred by the fitted intercept p; see the module docstring for the formula.
    Returns a (len(lams),) float64 tensor. ``cache``: see :func:`class_gram`.
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
    G, u = m.gram(fit.mu)
    Gt = fit.Q.T @ G @ fit.Q
    cross_gram, _ = class_gram(fit.train, fit.mu, e=m, cache=cache)  # Σ_c b_c b_{e,c}ᵀ over the classes of both
    a = _diag_rotated(cross_gram, fit.Q)                     # diag(Bt Beᵀ) in the eigenbasis
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
            needed = torch.arange(n_classes, device=fit.Q.device)
        slot = torch.full((n_classes,), -1, dtype=torch.long, device=fit.Q.device)
        slot[needed] = torch.arange(len(needed), device=fit.Q.device)
        cache["slot"] = slot
        cache["Wt"] = torch.cat([fit.weight_rows(lam, needed[s:s + CLASS_BLOCK])  # (class, d): rows gather fast
                                 for s in range(0, len(needed), CLASS_BLOCK)]) if len(needed) else \
            torch.zeros(0, fit.Q.shape[0], dtype=F64, device=fit.Q.device)
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
