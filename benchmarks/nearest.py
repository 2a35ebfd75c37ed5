"""Latency of the explorer's nearest-tokens query (geometry.nearest) on a realistic store.

    .venv/bin/python benchmarks/nearest.py [--tokens 20000] [--model smollm2-135m] [--layer 15]
                                           [--store DIR] [--device cpu] [--k 10] [--repeats 20]

Captures ``--tokens`` tokens of one resid_post layer of ``--model`` to a disk store in float32 (or
reuses ``--store``), then times, as the explorer runs them:

- cold: the layer read from the store (memory-mapped; its files are in the page cache, just written)
  onto ``--device``, then the first query; each part separately;
- warm: a query against the held layer (median over ``--repeats`` random query rows), one query and
  16 at once, for both metrics; and ``chunk_size`` 4096 (the default) beside a whole-layer chunk;
- a float64 numpy brute force over a prepared float64 copy of the layer, as a reference point (it
  holds a host copy at twice the size, which the query does not).
Every answer is checked against that brute force.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def brute_rows(X64: np.ndarray, q: int, k: int, metric: str, keep: np.ndarray) -> np.ndarray:
    if metric == "cosine":
        U = X64 / np.linalg.norm(X64, axis=1, keepdims=True)
        d = np.clip(1.0 - U @ U[q], 0.0, 2.0)
    else:
        d = np.sqrt(((X64 - X64[q]) ** 2).sum(axis=1))
    ok = keep.copy()
    ok[q] = False
    cand = np.nonzero(ok)[0]
    return cand[np.lexsort((cand, d[cand]))][:k]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20_000)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--corpus", default="wiki-sample")
    ap.add_argument("--layer", type=int, default=15)
    ap.add_argument("--store", default=None, help="reuse this store (one resid_post layer is read)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()

    import torch

    import geometry
    import lens
    from lens.runtime.threads import configure_threads

    configure_threads()
    if args.store is None:
        out = Path(tempfile.mkdtemp(prefix="nearest-bench-")) / "store"
        t0 = time.perf_counter()
        lens.capture(lens.load_model(args.model), corpus=args.corpus, sites=["resid_post"], layers=[args.layer],
                     max_tokens=args.tokens, out=out, progress=False)
        print(f"captured {args.tokens} tokens of {args.model} layer {args.layer} into {out} "
              f"({time.perf_counter() - t0:.0f} s)")
    else:
        out = Path(args.store)

    t0 = time.perf_counter()
    store = lens.open_store(out)
    t_open = time.perf_counter() - t0
    t0 = time.perf_counter()
    X = store.get(layer=args.layer).to(args.device)
    if X.device.type == "cuda":
        torch.cuda.synchronize()
    t_read = time.perf_counter() - t0
    keep = store.mask(min_pos=1)
    rng = np.random.default_rng(0)
    queries = rng.choice(np.nonzero(keep)[0], size=args.repeats + 16, replace=False)
    t0 = time.perf_counter()
    geometry.nearest(X, int(queries[0]), args.k, eligible=keep)
    t_first = time.perf_counter() - t0
    n, d = X.shape
    print(f"store {out}: {n} tokens x {d}, {store.dtype}, layer {args.layer} on {X.device}; "
          f"{int(keep.sum())} eligible (no special tokens, no position 0); k={args.k}; torch threads "
          f"{torch.get_num_threads()}")
    print(f"cold: open {t_open * 1e3:.1f} ms + layer to {args.device} {t_read * 1e3:.1f} ms "
          f"+ first query {t_first * 1e3:.1f} ms = {(t_open + t_read + t_first) * 1e3:.1f} ms")

    X64 = X.to(torch.float64).cpu().numpy()
    rows = []
    for metric in geometry.METRICS:
        for label, many, chunk in (("1 query", 1, 4096), ("1 query, one chunk", 1, n), ("16 queries", 16, 4096)):
            times = []
            for j in range(args.repeats):
                q = queries[j : j + many]
                t0 = time.perf_counter()
                got = geometry.nearest(X, q, args.k, metric=metric, eligible=keep, chunk_size=chunk)
                times.append(time.perf_counter() - t0)
                if j < 3:
                    for a, qi in enumerate(q):
                        assert got.rows[a].tolist() == brute_rows(X64, int(qi), args.k, metric, keep).tolist()
            rows.append((metric, label, statistics.median(times) * 1e3, min(times) * 1e3))
        times = []
        for j in range(args.repeats):
            t0 = time.perf_counter()
            brute_rows(X64, int(queries[j]), args.k, metric, keep)
            times.append(time.perf_counter() - t0)
        rows.append((metric, "numpy float64 brute force (reference)", statistics.median(times) * 1e3,
                     min(times) * 1e3))
    print(f"warm ({args.repeats} queries each):")
    print(f"  {'metric':<10} {'query':<40} {'median ms':>10} {'min ms':>8}")
    for metric, label, med, best in rows:
        print(f"  {metric:<10} {label:<40} {med:>10.1f} {best:>8.1f}")


if __name__ == "__main__":
    main()
