"""studies.job.pool: chains stay in one worker, cheapest first; workers start with their
thread share; a worker that dies fails its study alone; workers die with a killed job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from studies.job.pool import Chain, plan_chains, run_chains


# ---------------------------------------------------------------- run functions the spawned workers import
def report(name, *args):
    import torch

    return {"study": name, "pid": os.getpid(), "threads": torch.get_num_threads(),
            "env": os.environ.get("LENS_NUM_THREADS"), "omp": os.environ.get("OMP_NUM_THREADS"),
            "t": time.time(), "args": list(args)}


def die_on_b(name, *args):
    if name == "b":
        os._exit(3)
    return report(name, *args)


def failed(name, error):
    return {"study": name, "status": "failed", "error": error}


# ---------------------------------------------------------------- plan
def test_plan_keeps_groups_together_cheapest_first():
    names = ["pg", "ll", "tl", "ab", "li"]
    groups = {"pg": "lens", "ll": "lens"}
    seconds = {"pg": 50, "ll": 40, "tl": 90, "ab": 99, "li": 30}
    # a chain's total counts (ll + pg = 90 comes before ab's 99, ties keep registry order); inside it, cheapest first
    assert plan_chains(names, groups, seconds) == [["li"], ["ll", "pg"], ["tl"], ["ab"]]
    assert plan_chains(names, {}, {}) == [[n] for n in names]  # no estimates: registry order


def test_plan_starts_the_longest_chains_at_once_then_cheap_results_then_longest_first():
    names = ["pg", "ll", "tl", "ab", "li", "x"]
    groups = {"pg": "lens", "ll": "lens"}
    seconds = {"pg": 50, "ll": 40, "tl": 300, "ab": 99, "li": 30, "x": 10}
    # two workers: the longest chain (tl) starts on one; the other runs the cheap ones up to a minute (x, li), then
    # the rest longest first (ll+pg = 90 after ab = 99)
    assert plan_chains(names, groups, seconds, jobs=2) == [["tl"], ["x"], ["li"], ["ab"], ["ll", "pg"]]
    # three: the two longest first, longest first
    assert plan_chains(names, groups, seconds, jobs=3) == [["tl"], ["ab"], ["x"], ["li"], ["ll", "pg"]]
    # one worker, or no estimates: cheapest first, registry order
    assert plan_chains(names, groups, seconds, jobs=1) == [["x"], ["li"], ["ll", "pg"], ["ab"], ["tl"]]
    assert plan_chains(names, {}, {}, jobs=2) == [[n] for n in names]
    # the first result comes first even when it alone is over a minute
    big = {"a": 500, "b": 90, "c": 80, "d": 70}
    assert plan_chains(list(big), {}, big, jobs=2) == [["a"], ["d"], ["b"], ["c"]]


def test_longest_first_shortens_a_two_worker_job():
    """Simulated list scheduling of the plan on 2 workers, with the main job's measured seconds (make demo,
    2026-12-05): no long chain runs alone at the end."""
    import heapq

    seconds = {"tuned-lens": 221, "logit-lens": 112, "prediction-gains": 72, "intrinsic-dim": 89,
               "layer-ablation": 81, "context-knob": 69, "probes": 52, "linearity": 37, "senses": 26,
               "context-memory": 25, "filler-tokens": 24, "anisotropy": 17, "depth-use": 9}
    names, groups = list(seconds), {"logit-lens": "lens", "prediction-gains": "lens"}

    def makespan(order):
        free = [0.0, 0.0]
        for chain in order:
            t = heapq.heappop(free)
            heapq.heappush(free, t + sum(seconds[n] for n in chain))
        return max(free)

    best = sum(seconds.values()) / 2
    assert makespan(plan_chains(names, groups, seconds, jobs=2)) < 1.04 * best
    assert makespan(plan_chains(names, groups, seconds, jobs=1)) > 1.08 * best  # cheapest first: the lens chain and the tuned lens at the end
