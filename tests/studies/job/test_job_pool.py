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


def test_plan_starts_the_longest_chains_at_once_and_the_rest_cheapest_first():
    names = ["pg", "ll", "tl", "ab", "li", "x"]
    groups = {"pg": "lens", "ll": "lens"}
    seconds = {"pg": 50, "ll": 40, "tl": 300, "ab": 99, "li": 30, "x": 10}
    # two workers: the longest chain (tl) starts on one, the other runs the rest cheapest first
    assert plan_chains(names, groups, seconds, jobs=2) == [["tl"], ["x"], ["li"], ["ll", "pg"], ["ab"]]
    # three: the two longest first, longest first
    assert plan_chains(names, groups, seconds, jobs=3) == [["tl"], ["ab"], ["x"], ["li"], ["ll", "pg"]]
    # one worker, or no estimates: as before
    assert plan_chains(names, groups, seconds, jobs=1) == [["x"], ["li"], ["ll", "pg"], ["ab"], ["tl"]]
    assert plan_chains(names, {}, {}, jobs=2) == [[n] for n in names]


def test_longest_first_shortens_a_two_worker_job():
    """Simulated list scheduling of the plan on 2 workers: the makespan with the longest chain started first is
    the larger of it and the rest's share, not the rest's share plus it."""
    import heapq

    names = [f"s{i}" for i in range(8)] + ["big"]
    seconds = {**{f"s{i}": 60.0 for i in range(8)}, "big": 400.0}

    def makespan(order):
        free = [0.0, 0.0]
        for chain in order:
            t = heapq.heappop(free)
            heapq.heappush(free, t + sum(seconds[n] for n in chain))
        return max(free)

    assert makespan(plan_chains(names, {}, seconds, jobs=2)) == 460.0  # big from 0 to 400 beside six 60s; then one each
    assert makespan(plan_chains(names, {}, seconds, jobs=1)) == 640.0  # cheapest first: big starts at 240


# ---------------------------------------------------------------- run
def test_chains_run_in_one_worker_in_order_with_the_thread_share():
    before = {k: os.environ.get(k) for k in ("LENS_NUM_THREADS", "OMP_NUM_THREADS")}
    started = []
    chains = [Chain(items=[("a", (1,)), ("b", (2,)), ("c", (3,))]), Chain(items=[("d", (4,))])]
    rows = run_chains(chains, report, jobs=2, threads=1, on_start=started.append, failed_row=failed)
    by = {r["study"]: r for r in rows}
    assert sorted(by) == ["a", "b", "c", "d"] and sorted(started) == ["a", "b", "c", "d"]
    assert by["a"]["pid"] == by["b"]["pid"] == by["c"]["pid"] != by["d"]["pid"] != os.getpid()
    assert by["a"]["t"] < by["b"]["t"] < by["c"]["t"]
    assert by["b"]["args"] == [2]
    assert all(r["threads"] == 1 and r["env"] == "1" and r["omp"] == "1" for r in rows)
    assert {k: os.environ.get(k) for k in before} == before  # the workers' environment did not leak here


def test_a_dying_worker_fails_its_study_alone():
    chains = [Chain(items=[("a", ()), ("b", ()), ("c", ())]), Chain(items=[("d", ())])]
    rows = run_chains(chains, die_on_b, jobs=2, threads=1, failed_row=failed)
    by = {r["study"]: r for r in rows}
    assert sorted(by) == ["a", "b", "c", "d"]
    assert by["b"]["status"] == "failed" and "died (exit code 3)" in by["b"]["error"]
    assert by["c"]["pid"] != by["a"]["pid"]  # the rest of the chain ran in a fresh worker
    assert "status" not in by["d"]


def test_workers_die_with_a_killed_job(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    pidfile = tmp_path / "pid"
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = {[str(Path(__file__).parent), str(Path(__file__).resolve().parents[3])]!r}
        from studies.job.pool import Chain, run_chains
        import test_job_pool
        if __name__ == "__main__":
            run_chains([Chain(items=[("x", ({str(pidfile)!r},))])], test_job_pool.sleep_forever, jobs=1,
                       threads=1, failed_row=test_job_pool.failed)
    """))
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        t0 = time.time()
        while not pidfile.exists() and time.time() - t0 < 120:
            time.sleep(0.05)
        worker = int(pidfile.read_text())
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        t0 = time.time()
        while _alive(worker) and time.time() - t0 < 20:
            time.sleep(0.05)
        assert not _alive(worker), "the worker outlived its job"
    finally:
        if proc.poll() is None:
            proc.kill()


def sleep_forever(name, pidfile):
    Path(pidfile).write_text(str(os.getpid()))
    while True:
        time.sleep(1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_a_worker_whose_parent_is_gone_leaves_at_once():
    """A worker started just as its job died was handed to init or, under a subreaper (a container's
    init, a CI runner), to that process: either way its parent is no longer the job's pid, and it leaves."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    root = str(Path(__file__).resolve().parents[3])
    code = "import os, sys; from studies.job.pool import _die_with_parent; _die_with_parent({}); print('stayed')"
    env = {**os.environ, "PYTHONPATH": root}
    gone = subprocess.run([sys.executable, "-c", code.format("os.getppid() + 1")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert gone.returncode == 1 and "stayed" not in gone.stdout, gone.stderr
    here = subprocess.run([sys.executable, "-c", code.format("os.getppid()")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert here.returncode == 0 and "stayed" in here.stdout, here.stderr
