"""Benchmark: closed-form prediction residual against scikit-learn ``Ridge``.

    .venv/bin/python benchmarks/prediction_residual.py                 # synthetic 30 x 100k x 576, vocab 49152
    .venv/bin/python benchmarks/prediction_residual.py --store stores/smol --site resid_post

0. The probe's largest cost, a chunk's float64 Gram ``S += xᵀx`` (token x d_model²): torch's
   ``addmm_`` (MKL in torch's wheels) against numpy's BLAS (OpenBLAS in numpy's wheels), which
   ``probes.ridge_closed_form`` uses on the CPU; interleaved, median of 3, the ratio printed.
1. Our closed form (``probes.PredictionResidual``) over all layers and all tokens (default 100k),
   with the 1000-replicate document bootstrap: wall time, PR per layer, the law's summary.
2. On a document subsample small enough for scikit-learn to hold the dense one-hot targets
   (tokens × vocab float64), the same protocol both ways on a few layers — ridge strength chosen on
   the validation documents over the same grid, refit on train + validation, PR on the test
   documents, plus the in-sample fit — checking equal PR to 1e-4 and printing the speed ratio
   (like for like on the subsample; and scikit-learn's subsample time scaled linearly in tokens,
   which is optimistic for it, against our full run).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probes.prediction_residual import DEFAULT_ALPHAS, PredictionResidual  # noqa: E402
from probes.synthetic import ZipfStates  # noqa: E402


class _StoreLayers:
    """Lazy per-layer view of an activation store (``lens.open_store``)."""

    def __init__(self, store, site):
        self.store, self.site = store, site
        self.layers = list(store.layers(site))

    def __len__(self):
        return len(self.layers)

    def __getitem__(self, i):
        return self.store.get(layer=self.layers[i], site=self.site, dtype=torch.float32)


def _load(args):
    if args.store is None:
        data = ZipfStates(n_tokens=args.n_tokens, n_layers=args.layers, d_model=args.d_model,
                          vocab=args.vocab, seed=args.seed)
        return data, data.next_ids, data.docs, args.vocab, "synthetic Zipf"
    import lens  # only for a real store

    store = lens.open_store(args.store)
    toks = store.tokens
    view = _StoreLayers(store, args.site)
    vocab = int(store.manifest.get("d_vocab", int(toks["next_token_id"].max()) + 1))
    return view, np.asarray(toks["next_token_id"]), np.asarray(toks["doc"]), vocab, f"store {args.store}"


def _sklearn_protocol(X, y, docs, est, alphas, vocab):
    """The estimator's held-out and in-sample protocol with scikit-learn Ridge on dense one-hot Y."""
    from sklearn.linear_model import Ridge

    Xn = X / np.sqrt((X ** 2).mean(1, keepdims=True) + est.eps)     # fresh RMSNorm
    Y = np.zeros((len(y), vocab))
    Y[np.arange(len(y)), y] = 1.0
    tr, va, te = (np.isin(docs, d) for d in (est.train_docs_, est.val_docs_, est.test_docs_))

    def pr(alpha, fit_rows, score_rows):
        P = Ridge(alpha=alpha).fit(Xn[fit_rows], Y[fit_rows]).predict(Xn[score_rows])
        Ys = Y[score_rows]
        return ((Ys - P) ** 2).sum() / ((Ys - Ys.mean(0)) ** 2).sum()

    def scale(rows):
        Xc = Xn[rows] - Xn[rows].mean(0)
        return float(np.einsum("ij,ij->", Xc, Xc)) / X.shape[1]

    s_tr = scale(tr)
    val = [pr(a * s_tr, tr, va) for a in alphas]
    rel = alphas[int(np.argmin(val))]
    held_out = pr(rel * scale(tr | va), tr | va, te)
    every = np.ones(len(y), bool)
    in_sample = pr(est.in_sample_alpha * scale(every), every, every)
    return held_out, in_sample


def _gram_backends(d: int, chunk: int = 8192) -> None:
    from benchmarks.common import interleaved
    from lens.runtime.threads import configure_threads

    configure_threads()
    x = torch.randn(chunk, d, dtype=torch.float64)
    S = torch.zeros(d, d, dtype=torch.float64)
    xn, Sn = x.numpy(), S.numpy()
    t = interleaved({"torch": lambda: S.addmm_(x.T, x), "numpy": lambda: Sn.__iadd__(xn.T @ xn)}, repeats=3)
    print(f"[0] float64 Gram of a {chunk} x {d} chunk: torch addmm_ {t['torch']:.3f} s, numpy's BLAS "
          f"{t['numpy']:.3f} s -> numpy {t['torch'] / t['numpy']:.2f}x torch's speed")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default=None, help="activation store path (default: synthetic data)")
    ap.add_argument("--site", default="resid_post")
    ap.add_argument("--n-tokens", type=int, default=100_000)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--d-model", type=int, default=576)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--subsample", type=int, default=2000, help="tokens for the scikit-learn comparison")
    ap.add_argument("--sk-layers", type=int, default=2, help="layers compared with scikit-learn")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--device", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    _gram_backends(args.d_model)
    X, next_ids, docs, vocab, what = _load(args)
    n_layers = len(X)
    print(f"data: {what}: {n_layers} layers, {len(next_ids)} tokens, vocab {vocab}, "
          f"torch threads {torch.get_num_threads()}")

    t0 = time.perf_counter()
    full = PredictionResidual(norm="rms", n_boot=args.n_boot, device=args.device, seed=args.seed).fit(
        X, next_ids, docs)
    t_full = time.perf_counter() - t0
    r = full.result_
    print(f"\n[1] closed form, all {n_layers} layers, {int(r.n_tokens.sum())} tokens, "
          f"{args.n_boot} bootstrap replicates: {t_full:.1f} s ({t_full / n_layers:.2f} s/layer)")
    print("layer  PR_heldout  [interval]            PR_in_sample  PR_token_id  alpha_rel")
    for i in range(n_layers):
        print(f"{int(r.layers[i]):5d}  {r.pr[i]:.5f}   [{r.pr_low[i]:.5f}, {r.pr_high[i]:.5f}]   "
              f"{r.pr_in_sample[i]:.5f}       {r.pr_token_id[i]:.5f}      {r.alpha_relative[i]:.0e}")
    s, si = r.summary, r.summary_in_sample
    print(f"law (held-out):  slope_log10 {s.slope_log10:.5f}  rho {s.decay_ratio:.5f}  "
          f"pearson_r {s.pearson_r:.4f}  (bootstrap r in [{r.pearson_interval[0]:.4f}, {r.pearson_interval[1]:.4f}])")
    print(f"law (in-sample): slope_log10 {si.slope_log10:.5f}  rho {si.decay_ratio:.5f}  pearson_r {si.pearson_r:.4f}")

    # [2] like-for-like on a document subsample scikit-learn can hold in memory
    rng = np.random.default_rng(args.seed)
    doc_ids = rng.permutation(np.unique(docs))
    keep_docs, n = [], 0
    counts = dict(zip(*np.unique(docs, return_counts=True)))
    for dd in doc_ids:
        if n >= args.subsample and len(keep_docs) >= 5:
            break
        keep_docs.append(dd)
        n += counts[dd]
    rows = np.flatnonzero(np.isin(docs, keep_docs) & (next_ids >= 0))
    layer_idx = np.linspace(0, n_layers - 1, min(args.sk_layers, n_layers)).round().astype(int)
    sub = [X[int(i)][torch.as_tensor(rows)].double().numpy() for i in layer_idx]
    y, d = next_ids[rows], docs[rows]
    print(f"\n[2] subsample: {len(rows)} tokens from {len(keep_docs)} documents, layers {layer_idx.tolist()}; "
          f"dense one-hot targets {len(rows)} x {vocab} float64 = {len(rows) * vocab * 8 / 2**30:.2f} GiB")
    t0 = time.perf_counter()
    ours = PredictionResidual(norm="rms", n_boot=0, seed=args.seed).fit([torch.from_numpy(a) for a in sub], y, d)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    sk = [_sklearn_protocol(a, y, d, ours, np.asarray(DEFAULT_ALPHAS), vocab) for a in sub]
    t_sk = time.perf_counter() - t0
    worst = 0.0
    for j, i in enumerate(layer_idx):
        dh, di = abs(sk[j][0] - ours.pr_[j]), abs(sk[j][1] - ours.pr_in_sample_[j])
        worst = max(worst, dh, di)
        print(f"layer {i:3d}: PR held-out ours {ours.pr_[j]:.6f} sklearn {sk[j][0]:.6f} (|diff| {dh:.1e}); "
              f"in-sample ours {ours.pr_in_sample_[j]:.6f} sklearn {sk[j][1]:.6f} (|diff| {di:.1e})")
    ok = worst < 1e-4
    print(f"equal PR to 1e-4: {'yes' if ok else 'NO'} (max |diff| {worst:.1e})")
    print(f"time on the subsample: ours {t_ours:.2f} s, scikit-learn {t_sk:.2f} s -> "
          f"speed ratio {t_sk / t_ours:.1f}x (goal >= 10x)")
    per_layer_sk = t_sk / len(layer_idx) * (int(r.n_tokens.sum()) / len(rows))
    print(f"scikit-learn scaled linearly to {int(r.n_tokens.sum())} tokens x {n_layers} layers: "
          f"{per_layer_sk * n_layers:.0f} s (it would need {int(r.n_tokens.sum()) * vocab * 8 / 2**30:.0f} GiB "
          f"for Y) vs ours {t_full:.0f} s -> ratio {per_layer_sk * n_layers / t_full:.1f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
