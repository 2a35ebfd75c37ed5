"""One capture on existing launchers: torchrun (real ``python -m torch.distributed.run`` on the CPU with
gloo) and Slurm job arrays (the array's environment set by the test, each task a real separate process),
each giving a store byte-identical to a single-process capture, after a clean run and after a process
killed mid-way and rerun with ``--resume``.

Byte-identical: every shard file and token column byte for byte; the manifest equal but for its creation
time, its seal (a hash of the manifest, so it follows) and ``merged_from`` (the provenance a merge adds).
The reference capture runs in a forked child on one thread, as every rank and task does here
(``LENS_NUM_THREADS=1``), so all of them take the same BLAS code path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lens.errors import LensInputError
from lens.capturing.launch import (SLURM_ARRAY, SLURM_VARS, TORCH_VARS, TORCHRUN, launch_context, merge_command, part_dir,
                         parts_root, rank_device, threads_per_process)
from lens.store.parts import Part
from tests.lens.store_harness import ROOT, capture_argv, drop_merge_fidelity, fork_cli, store_files

LAUNCH_VARS = TORCH_VARS + SLURM_VARS + ("LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_ARRAY_TASK_STEP")
TORCHRUN_TIMEOUT_S = 240


@pytest.fixture(autouse=True)
def no_launcher_here(monkeypatch):
    """Whatever launched the test run, its children see only the environment each test gives them."""
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)


def assert_same_as_single(got: Path, single: Path) -> None:
    a, b = store_files(got), store_files(single)
    assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
    for name in a:
        if name != "manifest.json":
            assert a[name] == b[name], name
    ma, mb = json.loads(a["manifest.json"]), json.loads(b["manifest.json"])
    assert [p["part"] for p in ma.pop("merged_from")] == ["1/2", "2/2"]
    assert [p["verdict"] for p in drop_merge_fidelity(ma, mb)] == ["ok", "ok"]
    for m in (ma, mb):
        m.pop("created"), m.pop("manifest_sha256")
    assert ma == mb


@pytest.fixture(scope="module")
def models(tiny_llama):
    return {"tiny-llama": tiny_llama}


@pytest.fixture(scope="module")
def single(models, tmp_path_factory) -> Path:
    """The single-process capture every launched one must equal (forked, one thread)."""
    out = tmp_path_factory.mktemp("single") / "store"
    done = fork_cli(capture_argv(out), models).wait()
    assert done.rc == 0, done.stderr
    assert len(json.loads((out / "manifest.json").read_text())["shards"]) >= 4  # enough to split in two
    return out


# --------------------------------------------------------------------------- the environment
TORCH_ENV = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_the_environment_chooses_the_part():
    ctx = launch_context(TORCH_ENV)
    assert (ctx.launcher, ctx.part, ctx.rank, ctx.world_size, ctx.local_rank, ctx.leader) == (
        TORCHRUN, Part(2, 2), 1, 2, 1, False)
    assert launch_context({**TORCH_ENV, "RANK": "0", "LOCAL_RANK": "0"}).leader
    one = launch_context({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})  # a launch of one: no parts
    assert one.launcher == TORCHRUN and one.part is None
    # Slurm ids counted from SLURM_ARRAY_TASK_MIN (and by the step, when the array has one)
    slurm = {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "5"}
    assert launch_context(slurm).part == Part(3, 4) and launch_context(slurm).launcher == SLURM_ARRAY
    stepped = {"SLURM_ARRAY_TASK_ID": "6", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "2",
               "SLURM_ARRAY_TASK_STEP": "2"}
    assert launch_context(stepped).part == Part(3, 3)
    plain = launch_context({}, part="2/3")
    assert plain.launcher == "" and plain.part == Part(2, 3)
    assert threads_per_process(launch_context({**TORCH_ENV, "LOCAL_WORLD_SIZE": "2"}), 16) == 8
    assert threads_per_process(launch_context(slurm), 16) is None


@pytest.mark.parametrize("env, part, expect", [
    ({**TORCH_ENV, "RANK": "2"}, None, "RANK=2 with WORLD_SIZE=2: expected 0 <= RANK < WORLD_SIZE"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, None, "partial torchrun environment: RANK=0 WORLD_SIZE=2 is set but LOCAL_RANK is not"),
    ({**TORCH_ENV, "WORLD_SIZE": "two"}, None, "WORLD_SIZE='two': expected an integer >= 1"),
    ({**TORCH_ENV, "MASTER_PORT": ""}, None, "MASTER_PORT is not set"),
    ({**TORCH_ENV, "LOCAL_WORLD_SIZE": "1"}, None, "LOCAL_RANK=1 with LOCAL_WORLD_SIZE=1"),
    (TORCH_ENV, "1/2", "--part 1/2 was given, but the launcher already chooses this process's part (RANK=1"),
    ({"SLURM_ARRAY_TASK_ID": "3"}, None, "partial Slurm array environment: SLURM_ARRAY_TASK_ID=3 is set but "
                                         "SLURM_ARRAY_TASK_COUNT, SLURM_ARRAY_TASK_MIN are not"),
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0"}, None,
     "task 4 is not one of 4 evenly spaced ids from 0"),
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "0"}, "2/2",
     "--part 2/2 was given, but the launcher already chooses"),
    ({**TORCH_ENV, "SLURM_ARRAY_TASK_ID": "0"}, None, "both a torchrun environment (RANK=1 WORLD_SIZE=2 LOCAL_RANK=1) "
                                                     "and a Slurm array (SLURM_ARRAY_TASK_ID=0)"),
])
def test_an_inconsistent_environment_is_refused(env, part, expect):
    with pytest.raises(LensInputError) as err:
        launch_context(env, part=part)
    assert expect in str(err.value)


def test_the_command_line_refuses_it_in_one_line_before_loading_anything(monkeypatch, capsys):
    from app.commands.cli import main

    for k, v in {**TORCH_ENV, "RANK": "5"}.items():
        monkeypatch.setenv(k, v)
    assert main(["capture", "no-such-model", "--out", "/nonexistent/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "lens: error: RANK=5 with WORLD_SIZE=2: expected 0 <= RANK < WORLD_SIZE"


def test_each_rank_gets_its_own_device():
    import torch

    ctx = launch_context(TORCH_ENV)
    if not torch.cuda.is_available():
        assert rank_device(ctx, None) == "cpu"  # no GPU: the CPU, with gloo
        with pytest.raises(LensInputError, match="'cuda:1' was requested"):
            rank_device(ctx, "cuda")  # bare cuda is the rank's own GPU
    else:
        n = torch.cuda.device_count()
        if n >= 2:
            assert rank_device(ctx, None) == rank_device(ctx, "cuda") == "cuda:1"
        else:
            with pytest.raises(LensInputError, match="only 1 CUDA device"):
                rank_device(ctx, None)
    assert rank_device(ctx, "cpu") == "cpu"
    assert rank_device(launch_context({}), None) == "cpu"  # not launched: the command line's default


def test_where_the_parts_live(tmp_path):
    out = tmp_path / "s"
    assert parts_root(out) == tmp_path / "s.parts" and part_dir(out, Part(2, 3)) == tmp_path / "s.parts/part-2-of-3"
    assert merge_command(out, 2) == f"lens store merge {tmp_path}/s.parts/part-1-of-2 {tmp_path}/s.parts/part-2-of-2 --out {out}"


# --------------------------------------------------------------------------- Slurm job arrays
def _task(i: int, argv, models, tmp_path, env=None, low: int = 3):
    """Array task i (0-based) of 2 of an array whose ids start at ``low``, as a forked process."""
    slurm = {"SLURM_ARRAY_TASK_ID": str(low + i), "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": str(low)}
    stdout = tmp_path / f"task{i}-{time.time_ns()}.out"
    return fork_cli(argv, models, env={**slurm, **(env or {})}, stdout=stdout), stdout


def test_slurm_array_sequential_with_a_killed_task(single, models, tmp_path, capsys):
    out = tmp_path / "s"
    argv = capture_argv(out)
    child, _ = _task(1, argv, models, tmp_path, env={"LENS_STORE_FAULT": "shard.renamed@2"})
    assert child.wait().killed
    assert not json.loads((part_dir(out, Part(2, 2)) / "manifest.json").read_text())["complete"]
    child, stdout = _task(0, argv, models, tmp_path)
    done = child.wait()
    assert done.rc == 0, done.stderr
    said = stdout.read_text()
    assert "waiting for part 2/2" in said and merge_command(out, 2) in said, said
    assert not out.exists() and json.loads((part_dir(out, Part(1, 2)) / "manifest.json").read_text())["complete"]
    child, stdout = _task(1, argv + ["--resume"], models, tmp_path)  # the killed task, rerun: the last merges
    done = child.wait()
    assert done.rc == 0, done.stderr
    assert "2 parts merged and verified by slurm-array part 2/2" in stdout.read_text()
    assert_same_as_single(out, single)
    assert not parts_root(out).exists() and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("s")) == ["s"]
    # a rerun after the merge captures nothing and changes nothing; without --resume it is refused
    before = store_files(out)
    child, stdout = _task(0, argv + ["--resume"], models, tmp_path)
    done = child.wait()
    assert done.rc == 0 and "nothing left to capture" in stdout.read_text(), done.stderr
    assert store_files(out) == before and not parts_root(out).exists()
    child, _ = _task(0, argv, models, tmp_path)
    line = child.wait().error_line()
    assert f"a store already exists at {out}" in line and "--resume" in line


def test_slurm_array_concurrent_tasks_merge_once(single, models, tmp_path):
    out = tmp_path / "s"
    tasks = [_task(i, capture_argv(out), models, tmp_path, low=0) for i in (0, 1)]
    results = [(child.wait(), stdout.read_text()) for child, stdout in tasks]
    assert all(done.rc == 0 for done, _ in results), [done.stderr for done, _ in results]
    said = [text for _, text in results]
    assert sum("parts merged and verified" in text for text in said) == 1, said
    assert_same_as_single(out, single)
    assert not parts_root(out).exists() and not (tmp_path / "s.launch.lock").exists()


# --------------------------------------------------------------------------- torchrun
def _torchrun(argv, tmp_path, name, env=None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LENS_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", **(env or {})}
    env.pop("LENS_STORE_FAULT", None)
    log = open(tmp_path / f"{name}.log", "w")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "lens", *map(str, argv)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _finish(proc: subprocess.Popen, tmp_path, name) -> tuple[int, str]:
    try:
        rc = proc.wait(timeout=TORCHRUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return rc, (tmp_path / f"{name}.log").read_text(errors="replace")


def _wrapped(argv, tmp_path, name: str) -> subprocess.Popen:
    """``lens capture ... --nproc-per-node 2``: the workbench starts torchrun itself."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LENS_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1"}
    env.pop("LENS_STORE_FAULT", None)
    log = open(tmp_path / f"{name}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "lens", *map(str, argv), "--nproc-per-node", "2"], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def test_torchrun_two_ranks_equal_one_capture(single, tmp_path):
    out = tmp_path / "s"
    rc, log = _finish(_wrapped(capture_argv(out), tmp_path, "run"), tmp_path, "run")  # torchrun, started by lens
    assert rc == 0, log
    assert "2 parts merged and verified by torchrun part 1/2" in log and "captured torchrun part 2/2" in log, log
    assert_same_as_single(out, single)
    assert not parts_root(out).exists()
    # the documented command rerun onto its finished store: one line, exit 2, torchrun never started
    before = store_files(out)
    rc, log = _finish(_wrapped(capture_argv(out), tmp_path, "rewrapped"), tmp_path, "rewrapped")
    assert rc == 2 and [l for l in log.splitlines() if l.strip()] == [
        f"lens: error: a store already exists at {out} (complete, merged from 2 parts): this launch has nothing left "
        "to capture; rerun it with --resume to check the store against this command (it captures nothing), or "
        "choose another --out"], log
    # torchrun started by hand, rerun onto its finished store: refused before any model is loaded, in one line
    # (rank 0's), the ranks exiting 2; torchrun itself ends in its own banner with status 1, whatever a rank's status
    rc, log = _finish(_torchrun(capture_argv(out), tmp_path, "rerun"), tmp_path, "rerun")
    errors = [l for l in log.splitlines() if l.startswith("lens: ")]
    assert rc == 1 and len(errors) == 1, log
    assert errors[0].startswith(f"lens: error: a store already exists at {out} (complete, merged from 2 parts)")
    assert "rerun it with --resume" in errors[0] and "exitcode  : 2" in log, log  # the first rank torchrun saw end
    assert store_files(out) == before


def test_the_wrapper_refuses_before_starting_torchrun(single, tmp_path, monkeypatch, capsys):
    import shutil

    from app.commands.cli import main

    started = []
    monkeypatch.setattr(subprocess, "call", lambda cmd, *a, **k: started.append(cmd) or 0)
    out = tmp_path / "s"
    shutil.copytree(single, out)
    assert main(capture_argv(out) + ["--nproc-per-node", "2"]) == 2 and not started
    assert capsys.readouterr().err.startswith(f"lens: error: a store already exists at {out} (complete): ")
    assert main(capture_argv(out) + ["--nproc-per-node", "2", "--part", "1/2"]) == 2 and not started
    assert "torchrun's ranks choose the parts" in capsys.readouterr().err
    for k, v in TORCH_ENV.items():
        monkeypatch.setenv(k, v)
    assert main(capture_argv(tmp_path / "new") + ["--nproc-per-node", "2"]) == 2 and not started
    assert "starts torchrun itself" in capsys.readouterr().err
    for k in TORCH_ENV:
        monkeypatch.delenv(k)
    # --resume onto the finished store, and a new --out: torchrun is started with the same arguments, less this one
    assert main(["-v", *capture_argv(out, resume=True), "--nproc-per-node=2"]) == 0
    assert main(capture_argv(tmp_path / "new") + ["--nproc-per-node", "2"]) == 0
    assert [c[1:7] for c in started] == [["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                                          "-m"]] * 2
    assert started[0][7:] == ["lens", "-v", *capture_argv(out, resume=True)]
    assert started[1][7:] == ["lens", *capture_argv(tmp_path / "new")]


def _rank(rank: int, argv, models, tmp_path):
    """torchrun's rank ``rank`` of 2, as a forked process (the environment torchrun gives it)."""
    env = {**TORCH_ENV, "RANK": str(rank), "LOCAL_RANK": str(rank)}
    stdout = tmp_path / f"rank{rank}-{time.time_ns()}.out"
    return fork_cli(argv, models, env=env, stdout=stdout), stdout


def test_a_rerun_onto_a_finished_store_is_one_line_and_exit_2_on_every_rank(single, models, tmp_path):
    """Rank 0 says it, the other ranks end silently with the same status; a refused --resume (other positions,
    a stale writer lock left by a killed run) is one line too, naming --positions all as 'all'."""
    import shutil

    out = tmp_path / "s"
    shutil.copytree(single, out)
    for rank in (0, 1):
        child, stdout = _rank(rank, capture_argv(out), models, tmp_path)
        done = child.wait()
        if rank == 0:
            line = done.error_line()
            assert line.startswith(f"lens: error: a store already exists at {out} (complete): this launch has nothing")
            assert "rerun it with --resume" in line and done.rc == 2, done.stderr
        else:
            assert done.rc == 2 and not done.stderr.strip() and not stdout.read_text().strip(), done.stderr
    (out / "writer.lock").write_text(json.dumps({"host": os.uname().nodename, "pid": 2 ** 22 + 17}))  # stale
    before = store_files(out)
    argv = capture_argv(out, resume=True) + ["--positions", "last"]
    child, _ = _rank(0, argv, models, tmp_path)
    line = child.wait().error_line()  # exactly one line: no stale-lock warning before it
    assert line == (f"lens: error: cannot resume {out}: it was captured with other settings (positions: store has "
                    "'all', this run has 'last')"), line
    child, stdout = _rank(1, argv, models, tmp_path)
    done = child.wait()
    assert done.rc == 0 and not done.stderr.strip() and not stdout.read_text().strip(), done.stderr
    assert store_files(out) == before


def _committed_shards(root: Path) -> int:
    try:
        m = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):  # not there yet, or being replaced
        return -1
    return -1 if m["complete"] else len(m["shards"])


def test_torchrun_rank_killed_midway_resumes_to_the_same_bytes(single, tmp_path):
    out = tmp_path / "s"
    victim = part_dir(out, Part(2, 2))
    proc = _torchrun(capture_argv(out), tmp_path, "killed", env={"LENS_DEBUG_BATCH_DELAY": "0.4"})
    deadline = time.time() + TORCHRUN_TIMEOUT_S
    while _committed_shards(victim) < 1 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None and _committed_shards(victim) >= 1, (tmp_path / "killed.log").read_text()
    pid = json.loads((victim / "writer.lock").read_text())["pid"]  # rank 1, the part's writer
    os.kill(pid, signal.SIGKILL)
    rc, log = _finish(proc, tmp_path, "killed")
    assert rc != 0, log  # torchrun saw its rank die and stopped the other
    assert _committed_shards(victim) >= 1 and not out.exists(), log  # killed mid-way: an incomplete part
    rc, log = _finish(_torchrun(capture_argv(out, resume=True), tmp_path, "resumed"), tmp_path, "resumed")
    assert rc == 0, log
    assert_same_as_single(out, single)
    assert not parts_root(out).exists()


def test_a_merge_killed_midway_is_redone_by_the_next_task(single, models, tmp_path):
    """The last task died while merging: its half-made store is recognised (incomplete, ``merged_from``)
    and made again from the parts, which are still there; the rerun task merges."""
    out = tmp_path / "s"
    for i in (1, 2):  # the parts, as two tasks that finished (plain --part into the parts' folders)
        done = fork_cli(capture_argv(part_dir(out, Part(i, 2))) + ["--part", f"{i}/2"], models).wait()
        assert done.rc == 0, done.stderr
    parts = [str(part_dir(out, Part(i, 2))) for i in (1, 2)]
    merge = fork_cli(["store", "merge", *parts, "--out", out, "--quiet"], models,
                     env={"LENS_STORE_FAULT": "shard.renamed@2"}).wait()
    assert merge.killed
    half = json.loads((out / "manifest.json").read_text())
    assert not half["complete"] and half["merged_from"]
    child, stdout = _task(0, capture_argv(out) + ["--resume"], models, tmp_path)
    done = child.wait()
    assert done.rc == 0, done.stderr
    assert "2 parts merged and verified by slurm-array part 1/2" in stdout.read_text()
    assert_same_as_single(out, single)
    assert not parts_root(out).exists()
