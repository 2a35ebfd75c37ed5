"""Disk-store memory and read speed.

    .venv/bin/python benchmarks/store_read.py [--tokens 200000] [--model smollm2-135m] [--keep DIR]

1. Captures ``--tokens`` tokens x every resid_post layer to a disk store in fp16 in a child
   process, sampling its RSS every 0.2 s: prints the peak and the RSS at 25/50/75/100 % of the
   tokens (flat = memory does not grow with the token count; target peak < 3 GB).
2. Reads one layer back (page cache warm) with and without checksum verification, as GB/s,
   beside a plain ``np.fromfile`` of the same bytes as the baseline (target >= 1 GB/s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def capture_with_rss(model: str, tokens: int, out: Path, corpus: str, device: str) -> dict:
    cmd = [sys.executable, "-m", "app", "capture", model, "--corpus", corpus, "--max-tokens", str(tokens),
           "--out", str(out), "--dtype", "float16", "--quiet", "--device", device, "--batch-size", "16"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ps = psutil.Process(proc.pid)
    samples = []  # (tokens done, rss bytes)
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss
        except psutil.NoSuchProcess:
            break
        done = 0
        try:
            done = json.loads((out / "manifest.json").read_text())["n_tokens"]
        except (OSError, ValueError, KeyError):
            pass
        samples.append((done, rss))
        time.sleep(0.2)
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"capture failed: {err.decode()[-2000:]}")
    peak = max(r for _, r in samples)
    at = {}
    for frac in (0.25, 0.5, 0.75, 1.0):
        rows = [r for d, r in samples if d <= frac * tokens]
        at[frac] = max(rows) if rows else float("nan")
    return {"seconds": time.time() - t0, "peak": peak, "at": at}


def read_speed(path: Path) -> dict:
    import lens

    store = lens.open_store(path, verify=False)
    layer = store.layers()[len(store.layers()) // 2]
    files = [path / "shards" / s["name"] / "resid_post.npy" for s in store.manifest["shards"]]
    nbytes = store.n_tokens * store.d_model * 2
    for f in files:  # warm the page cache
        f.read_bytes()

    def timed(fn, reps=3):
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best

    t_store = timed(lambda: store.get(layer=layer))
    verified = lens.open_store(path, verify=True)
    t_first_verify = timed(lambda: lens.open_store(path, verify=True).get(layer=layer), reps=1)
    t_verified = timed(lambda: verified.get(layer=layer))
    t_raw = timed(lambda: [np.fromfile(f, dtype=np.uint8) for f in files])  # whole files: all layers
    raw_bytes = sum(f.stat().st_size for f in files)
    return {"layer_bytes": nbytes, "store_gbps": nbytes / t_store / 1e9,
            "first_read_with_checksums_gbps": nbytes / t_first_verify / 1e9,
            "verified_cached_gbps": nbytes / t_verified / 1e9, "raw_fromfile_gbps": raw_bytes / t_raw / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--corpus", default="wiki-sample")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--keep", default=None, help="keep the store in this folder (default: a temp folder)")
    args = ap.parse_args()
    out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="lens-store-bench-")) / "store"
    try:
        if not (out / "manifest.json").exists():
            cap = capture_with_rss(args.model, args.tokens, out, args.corpus, args.device)
            gb = 1 / 1e9
            print(f"capture {args.tokens} tokens x all resid_post of {args.model} to disk (fp16): {cap['seconds']:.0f} s, "
                  f"{args.tokens / cap['seconds']:.0f} tok/s")
            print(f"  RSS peak {cap['peak'] * gb:.2f} GB (target < 3 GB: {'ok' if cap['peak'] < 3e9 else 'MISSED'}); "
                  + ", ".join(f"{int(k * 100)}%: {v * gb:.2f} GB" for k, v in cap["at"].items()))
        r = read_speed(out)
        print(f"read one layer ({r['layer_bytes'] / 1e6:.0f} MB) from the page cache: {r['store_gbps']:.2f} GB/s "
              f"(target >= 1 GB/s: {'ok' if r['store_gbps'] >= 1 else 'MISSED'}); with checksums on first read "
              f"{r['first_read_with_checksums_gbps']:.2f} GB/s (open + token table + one CRC per layer block); "
              f"verified, cached {r['verified_cached_gbps']:.2f} GB/s; baseline np.fromfile {r['raw_fromfile_gbps']:.2f} GB/s")
    finally:
        if not args.keep:
            shutil.rmtree(out.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
