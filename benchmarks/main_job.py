"""Benchmark: the main job's cost model — each study's time at several token budgets, and how it grows.

    .venv/bin/python benchmarks/main_job.py                                  # tiny-llama and SmolLM2, 5k..40k
    .venv/bin/python benchmarks/main_job.py --models tiny-llama --tokens 2000,4000,8000
    .venv/bin/python benchmarks/main_job.py --only linearity,anisotropy --out /tmp/costs

Each (model, budget) runs ``lens study all`` in a fresh process (so the process-level model cache and
thread pools start cold, as for a user) into ``OUT/<model>-<tokens>/``, and reads the per-study wall
times back from its ``main_job.json``. For every study it fits ``seconds ≈ c · tokens^k`` by least
squares on log-log (k, the exponent, says how the study grows: ~1 linear, ~2 quadratic) and prints a
markdown table (the README's). The store capture is one row ("capture"). Times on a shared machine are
only comparable within one run. With ``--jobs`` above 1 the studies overlap on worker processes of
fewer threads each: a study's seconds are then its own wall time in its worker and the total is less
than their sum.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import fit_exponent  # noqa: E402


def run_job(model: str, tokens: int, out: Path, only: str | None, corpus: str, jobs: str = "auto") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "app", "study", "all", "--model", model, "--corpus", corpus,
            "--max-tokens", str(tokens), "--out", str(out), "--quiet", "--jobs", str(jobs)]
    if only:
        argv += ["--only", only]
    subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
                   stdout=subprocess.DEVNULL)
    job = json.loads((out / "main_job.json").read_text())
    times = {"capture": job.get("capture_s")}
    times.update({r["study"]: (r["seconds"] if r["status"] == "ok" else None) for r in job["studies"]})
    times["total"] = job.get("wall_time_s")
    return times


def table(model: str, tokens: list[int], rows: dict[int, dict]) -> str:
    names = list(dict.fromkeys(k for t in tokens for k in rows[t]))
    head = "| " + model + " | " + " | ".join(f"{t // 1000}k s" if t >= 1000 else f"{t} s" for t in tokens) + \
        " | exponent |"
    lines = [head, "|---" * (len(tokens) + 2) + "|"]
    for n in names:
        secs = [rows[t].get(n) for t in tokens]
        k = fit_exponent(tokens, secs)
        cells = " | ".join("failed" if s is None else f"{s:.1f}" for s in secs)
        lines.append(f"| {n} | {cells} | {'—' if k is None else f'{k:.2f}'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny-llama,smollm2-135m")
    p.add_argument("--tokens", default="5000,10000,20000,40000")
    p.add_argument("--only", default=None, help="comma list of studies (default: all)")
    p.add_argument("--corpus", default="wiki-sample")
    p.add_argument("--out", default="/tmp/lens-main-job-costs")
    p.add_argument("--jobs", default="auto", help="the main job's --jobs (1: one study after another, "
                                                  "each with every core: per-study seconds add up to the total)")
    args = p.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",")]
    for model in args.models.split(","):
        rows = {}
        for t in tokens:
            rows[t] = run_job(model, t, Path(args.out) / f"{model}-{t}", args.only, args.corpus, args.jobs)
            print(f"{model} {t} tokens: {rows[t].get('total')} s", file=sys.stderr, flush=True)
        print(table(model, tokens, rows))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
