"""The store under crashes, full disks and concurrent writers (issue 14).

Every run is the real ``lens`` command line in a real process: a forked child (see ``store_harness``)
for the many cheap runs, a fresh interpreter for the reproduction of the commit-window crash, and a
user + mount namespace with a small tmpfs for the real full disk. Each crash must end in a store that
``--resume`` completes byte-identical to an uninterrupted capture, or in exit 2 with one line — never
in exit 1.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lens.store.faults import POINTS
from tests.lens.store_harness import ROOT, assert_same_store, capture_argv, fork_cli, run_cli, unshare_works


@pytest.fixture(scope="module")
def models(tiny_llama, tiny_gpt2):
    return {"tiny-llama": tiny_llama, "tiny-gpt2": tiny_gpt2}


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory):
    """An uninterrupted capture: (folder, number of shards, seconds the run took)."""
    out = tmp_path_factory.mktemp("reference") / "store"
    done = run_cli(capture_argv(out), models)
    assert done.rc == 0, done.stderr
    n_shards = len(json.loads((out / "manifest.json").read_text())["shards"])
    assert n_shards >= 6  # enough shards for faults at the first, a middle and the last one
    return out, n_shards, done.seconds


def _nth(nth, n_shards: int) -> int:
    """Symbolic hit numbers: the last shard's step, or the final manifest commit (complete = true)."""
    # manifest commits: 1 before any shard, one per shard, one marking the store complete
    return {"last-shard": n_shards, "final-commit": n_shards + 2}.get(nth, nth)


KILLS = [("lock.acquired", 1), ("manifest.tmp-written", 1), ("manifest.replaced", 1), ("shard.begin", 1),
         ("write", 1), ("write", 9), ("shard.data-synced", 1), ("shard.tokens-written", 2),
         ("shard.before-rename", 2), ("shard.renamed", 1), ("shard.renamed", 3), ("manifest.tmp-written", 2),
         ("manifest.replaced", 3), ("shard.renamed", "last-shard"), ("manifest.tmp-written", "final-commit"),
         ("manifest.replaced", "final-commit")]
NO_SPACE = [("lock.acquired", 1), ("manifest.tmp-written", 1), ("shard.begin", 2), ("write", 5),
            ("shard.tokens-written", 2), ("shard.before-rename", 1), ("shard.renamed", 2),
            ("manifest.tmp-written", 3), ("manifest.tmp-written", "final-commit")]


def test_every_protocol_step_has_a_fault_case():
    assert {p for p, _ in KILLS} == set(POINTS)


@pytest.mark.parametrize("action,point,nth", [("kill", p, n) for p, n in KILLS] + [("enospc", p, n) for p, n in NO_SPACE],
                         ids=lambda v: str(v))
def test_fault_at_each_commit_step_then_resume(action, point, nth, models, reference, tmp_path):
    ref, n_shards, _ = reference
    out = tmp_path / "store"
    spec = f"{point}@{_nth(nth, n_shards)}={action}"
    first = run_cli(capture_argv(out), models, env={"LENS_STORE_FAULT": spec})
    if action == "kill":
        assert first.killed, f"{spec} was never reached: {first.stderr}"
    else:
        assert first.rc == 2, first.stderr
        line = first.error_line()
        assert "No space left" in line or "disk is full" in line, line
        assert "Traceback" not in first.stderr
    if (out / "manifest.json").exists():  # what a reader sees meanwhile: the committed shards, all sound
        check = run_cli(["store", "verify", out], models)
        assert check.rc == 0, check.stderr
    resumed = run_cli(capture_argv(out, resume=True), models)
    assert resumed.rc == 0, resumed.stderr
    assert_same_store(out, ref)


def test_crash_during_the_resume_of_a_crash(models, reference, tmp_path):
    ref, _, _ = reference
    out = tmp_path / "store"
    assert run_cli(capture_argv(out), models, env={"LENS_STORE_FAULT": "shard.renamed@2"}).killed
    assert run_cli(capture_argv(out, resume=True), models, env={"LENS_STORE_FAULT": "shard.renamed@2"}).killed
    assert run_cli(capture_argv(out, resume=True), models, env={"LENS_STORE_FAULT": "write@3=enospc"}).rc == 2
    assert run_cli(capture_argv(out, resume=True), models).rc == 0
    assert_same_store(out, ref)


def test_twenty_real_kill_9_at_random_moments(models, reference, tmp_path):
    """kill -9 at uniformly random moments of a capture (and, every other run, of its first --resume
    too), then --resume: byte-identical to the uninterrupted capture, or exit 2 — never exit 1.
    ``LENS_STORE_KILLS=N`` runs a longer campaign."""
    ref, _, seconds = reference
    rng = random.Random(14)
    runs = int(os.environ.get("LENS_STORE_KILLS", "20"))
    tally = {"runs": runs, "killed": 0, "resume_killed": 0, "identical": 0, "refused": 0}
    # the kill window starts at the reference capture's duration; on a shared machine a later capture can
    # run faster than that one did, so a child that finished before its kill shrinks the window
    window = 0.9 * seconds
    for i in range(runs):
        out = tmp_path / f"k{i}"
        for argv, key in [(capture_argv(out), "killed")] + ([(capture_argv(out, resume=True), "resume_killed")]
                                                            if i % 2 else []):
            child = fork_cli(argv, models)
            time.sleep(rng.uniform(0.0, window))
            child.kill()
            killed = child.wait().killed
            tally[key] += killed
            if key == "killed" and not killed:
                window *= 0.7
        resumed = run_cli(capture_argv(out, resume=True), models)
        assert resumed.rc in (0, 2), resumed.stderr  # never an internal error
        if resumed.rc == 2:
            resumed.error_line()
            tally["refused"] += 1
        else:
            assert_same_store(out, ref)
            tally["identical"] += 1
        shutil.rmtree(out, ignore_errors=True)
    print(f"random kill -9: {tally}")
    assert tally["identical"] + tally["refused"] == runs
    assert tally["killed"] >= runs // 2  # most kills landed while the capture ran (else this tests nothing)


def test_a_real_process_killed_between_rename_and_manifest_resumes(reference, tmp_path):
    """The campaign's reproduction: a fresh interpreter dies right after a shard folder is renamed into
    place; the manifest does not list it. --resume used to fail with 'Directory not empty' (exit 1)."""
    ref, _, _ = reference
    out = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "app", *capture_argv(out)]
    died = subprocess.run(cmd, env={**env, "LENS_STORE_FAULT": "shard.renamed@3"}, capture_output=True, text=True,
                          timeout=300)
    assert died.returncode == -9, died.stderr
    listed = json.loads((out / "manifest.json").read_text())["shards"]
    assert len(listed) == 2 and (out / "shards" / "00002").is_dir()  # renamed, never listed
    resumed = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_store(out, ref)


def test_second_writer_and_resume_during_a_capture_are_refused(models, reference, tmp_path):
    ref, _, _ = reference
    out = tmp_path / "store"
    first = fork_cli(capture_argv(out), models, env={"LENS_DEBUG_BATCH_DELAY": "0.3"})
    deadline = time.time() + 60
    while not (out / "manifest.json").exists():
        assert time.time() < deadline and os.waitpid(first.pid, os.WNOHANG) == (0, 0)
        time.sleep(0.01)
    for argv in (capture_argv(out), capture_argv(out, resume=True), capture_argv(out, model="tiny-gpt2"),
                 capture_argv(out, model="tiny-gpt2", resume=True)):
        second = run_cli(argv, models)
        assert second.rc == 2, second.stderr
        assert f"is being written by pid {first.pid}" in second.error_line()
    assert os.waitpid(first.pid, os.WNOHANG) == (0, 0), "the first capture ended before the others were refused"
    done = first.wait()
    assert done.rc == 0, done.stderr
    assert run_cli(["store", "verify", out], models).rc == 0
    assert_same_store(out, ref)
    assert not (out / "writer.lock").exists()


def test_a_stale_lock_is_taken_over(models, reference, tmp_path):
    ref, _, _ = reference
    out = tmp_path / "store"
    out.mkdir()
    (out / "writer.lock").write_text(json.dumps({"host": os.uname().nodename, "pid": 2 ** 22 + 17}))
    done = run_cli(capture_argv(out), models)
    assert done.rc == 0, done.stderr
    assert_same_store(out, ref)


@pytest.mark.skipif(not unshare_works(), reason="cannot mount a tmpfs in a user namespace here "
                    "(the injected ENOSPC cases above cover the write path)")
def test_real_full_disk_and_no_inodes(reference, tmp_path):
    """A real small filesystem: the disk fills (or runs out of inodes) during a capture. Clear exit 2,
    last committed shard intact, and --resume after freeing space equals an uninterrupted capture."""
    ref, _, _ = reference
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(["unshare", "-rm", sys.executable, str(Path(__file__).with_name("full_disk_probe.py")),
                          str(tmp_path), str(report)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads(report.read_text())
    assert [r["scenario"] for r in results] == ["disk full", "disk full, kernel ENOSPC", "no inodes"]
    for r in results:
        assert r["capture_rc"] == 2, r
        lines = [l for l in r["capture_stderr"].splitlines() if l.startswith("lens: error:")]
        assert len(lines) == 1 and "--resume" in lines[0] and "Traceback" not in r["capture_stderr"], r
        assert ("no inodes left" if r["scenario"] == "no inodes" else "the disk is full") in lines[0], r
        assert r["committed_shards"] >= 1 and r["verify_rc"] == 0, r  # the committed shards are intact
        assert r["resume_rc"] == 0, r
        assert_same_store(tmp_path / r["copy"], ref)
