"""Benchmark: TwoNN, scikit-dimension against geometry.TwoNN, on the same points in one run.

    .venv/bin/python benchmarks/twonn.py                      # 50k x 576, both on all points
    .venv/bin/python benchmarks/twonn.py --skdim-n 20000      # skdim on the first 20k only
    .venv/bin/python benchmarks/twonn.py --device cuda        # ours on a GPU
    .venv/bin/python benchmarks/twonn.py --precisions auto,float32 --memory-chunks ''   # also the float32 search

The points lie on a 12-dimensional hypersphere rotated into 576 dimensions (SmolLM2's d_model) with
small isotropic noise. Ours runs once before and once after scikit-dimension (after a warm-up on a
small subset that compiles the scan), so load that drifts during the run hits both alike; the ratio
is scikit-dimension's time over the mean of ours. Prints both estimates, their relative difference,
the times, the ratio and whether the goal (≥ 10× at ±1%) is met; then our peak extra memory
for several chunk sizes (CPU: peak RSS above the pre-fit RSS, sampled every 2 ms by a thread; CUDA:
``torch.cuda.max_memory_allocated``), which should grow with the chunk size and not with n.
A benchmark script may print; library code does not.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import geometry  # noqa: E402
from benchmarks.common import PeakRSS  # noqa: E402
from lens.runtime.threads import available_cores, configure_threads  # noqa: E402


def points(n: int, d_manifold: int, d_ambient: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, d_manifold + 1))
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    Q, _ = np.linalg.qr(rng.normal(size=(d_ambient, d_manifold + 1)))
    return Z @ Q.T + 1e-3 * rng.normal(size=(n, d_ambient)) / np.sqrt(d_ambient)


class _Searched(logging.Handler):
    """Remembers the precision the last "auto" search ran in (geometry.neighbors logs its pilot)."""

    last = ""

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("knn: pilot"):
            _Searched.last = msg.rsplit(" ", 1)[-1]


def timed_ours(X, chunk_size: int, device: str, precision: str = "auto"):
    Xt = torch.from_numpy(X).to(device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t = time.perf_counter()
        est = geometry.TwoNN(chunk_size=chunk_size, precision=precision).fit(Xt)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        return est.dimension_, dt, (torch.cuda.max_memory_allocated() - base) / 2**20
    with PeakRSS() as mem:
        t = time.perf_counter()
        est = geometry.TwoNN(chunk_size=chunk_size, precision=precision).fit(Xt)
        dt = time.perf_counter() - t
    return est.dimension_, dt, mem.delta_mb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--d", type=int, default=576)
    ap.add_argument("--manifold-dim", type=int, default=12)
    ap.add_argument("--skdim-n", type=int, default=None, help="points for scikit-dimension (default: --n)")
    ap.add_argument("--chunk-size", type=int, default=2048)
    ap.add_argument("--memory-chunks", default="512,1024,2048,4096")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precisions", default="auto", help="comma list of search precisions for ours "
                    "(auto, bfloat16x3, bfloat16, float32); the first one is the one compared")
    ap.add_argument("--measure-chunk", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure_chunk:  # child process of the memory sweep: one JSON line
        X = points(args.n, args.manifold_dim, args.d)
        configure_threads()
        timed_ours(X[:3000], args.measure_chunk, args.device)  # warm-up: one-time torch/oneDNN buffers
        print(json.dumps(timed_ours(X, args.measure_chunk, args.device)))
        return

    import skdim

    from geometry.neighbors import search_precision

    log = logging.getLogger("geometry.neighbors")
    log.setLevel(logging.INFO)
    log.addHandler(_Searched())
    n_threads = configure_threads()
    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads; lens.runtime.threads: {available_cores()} cores "
          f"available, pools sized to {n_threads}), scikit-dimension {skdim.__version__}, {psutil.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} (other work on the machine skews times)")
    X = points(args.n, args.manifold_dim, args.d)
    n_sk = args.skdim_n or args.n
    Xs = X[:n_sk]
    print(f"points: {args.n} x {args.d} on a {args.manifold_dim}-sphere; scikit-dimension on the first {n_sk}")
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    # warm-up: compiles the scan (numba caches it on disk) and oneDNN's kernels for the tile shapes;
    # 4 chunks, so that "auto" also runs its pilot (geometry.neighbors._PILOT_MIN_CHUNKS) as below
    for p in precisions:
        timed_ours(X[: min(args.n, max(3000, 4 * args.chunk_size))], args.chunk_size, args.device, p)

    before = {p: timed_ours(Xs, args.chunk_size, args.device, p)[:2] for p in precisions}
    t = time.perf_counter()
    ref = skdim.id.TwoNN().fit(Xs).dimension_
    t_ref = time.perf_counter() - t
    after = {p: timed_ours(Xs, args.chunk_size, args.device, p)[:2] for p in precisions}
    print(f"\n[same {n_sk} points; ours timed before and after scikit-dimension]")
    print(f"  scikit-dimension TwoNN:                 d = {ref:.4f}   {t_ref:8.2f} s")
    for i, p in enumerate(precisions):
        (d1, t1), (d2, t2) = before[p], after[p]
        t_ours = (t1 + t2) / 2
        rel = abs(d1 - ref) / ref
        searched = search_precision(args.device, p)
        if p == "auto" and _Searched.last:  # the pilot's choice (see geometry.neighbors._pilot)
            searched = f"auto: {_Searched.last}"
        label = f"geometry.TwoNN ({args.device}, {searched})"
        print(f"  {label:39s} d = {d1:.4f}   {t1:8.2f} s, {t2:.2f} s   (chunk {args.chunk_size})")
        print(f"    ratio {t_ref / t_ours:.1f}x   estimates {ref:.4f} (scikit-dimension) vs {d1:.4f} (ours): "
              f"relative difference {100 * rel:.2e} %" + ("" if d1 == d2 else f"  (second run d = {d2:.4f})"))
        if i == 0:
            ok = t_ref / t_ours >= 10 and rel <= 0.01
            print(f"    goal (>= 10x at the same estimate, +-1%): {'met' if ok else 'NOT met'}   "
                  f"(load average now {os.getloadavg()[0]:.1f})")
    if n_sk < args.n:
        d_full, t_full, _ = timed_ours(X, args.chunk_size, args.device, precisions[0])
        print(f"\n[ours on all {args.n} points] d = {d_full:.4f}   {t_full:.2f} s")
    if not args.memory_chunks.strip():
        return

    print(f"\n[peak extra memory of ours on {args.n} points vs chunk size]")
    copy_mb = args.n * args.d * 4 / 2**20
    print(f"  input itself: {X.nbytes / 2**20:.0f} MiB float64; a full N x N float32 matrix would be "
          f"{args.n**2 * 4 / 2**20:.0f} MiB")
    print(f"  expected: one centred float32 copy of X ({copy_mb:.0f} MiB) + a few chunk x chunk float32 tiles")
    # each chunk size in a fresh process: the allocator keeps freed pages, so an earlier run in this
    # process would hide later peaks
    for c in [int(s) for s in args.memory_chunks.split(",")]:
        out = subprocess.run([sys.executable, __file__, "--n", str(args.n), "--d", str(args.d),
                              "--manifold-dim", str(args.manifold_dim), "--device", args.device,
                              "--measure-chunk", str(c)], capture_output=True, text=True, check=True)
        d_c, t_c, mb = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  chunk {c:5d}: peak +{mb:7.1f} MiB (tile {c * c * 4 / 2**20:5.1f} MiB)   {t_c:7.2f} s   d = {d_c:.4f}")


if __name__ == "__main__":
    main()
