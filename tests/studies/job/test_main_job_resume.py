"""`lens study all` killed mid-way (a real process, kill -9) and rerun with --resume: the finished
studies are kept, not redone; the rest run; every result equals an uninterrupted run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from app.commands.cli import main

ONLY = "prediction-gains,logit-lens,linearity"
ARGS = ["--model", "tiny-llama", "--max-tokens", "300", "--jobs", "1", "--only", ONLY, "--quiet"]
ROOT = Path(__file__).resolve().parents[3]


def _second_study_runs(rows) -> bool:
    """One study finished, the second running (rows are in registry order, the job's order is its own)."""
    status = [r["status"] for r in rows]
    return status.count("ok") == 1 and status.count("running") == 1


def _one_done_one_running(rows) -> bool:
    return any(r["status"] == "ok" for r in rows) and any(r["status"] == "running" for r in rows)


def _kill_when(out: Path, args: list, ready=_second_study_runs, timeout: float = 300,
               sig=signal.SIGKILL) -> tuple[int, str]:
    """Run the job in a fresh interpreter and send it ``sig`` once ``ready(main_job.json's rows)``;
    (its exit status, its stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # its stderr (and its workers') goes to a file: a pipe nobody reads would stall them at 64 kB
    err = open(out.parent / f"{out.name}.stderr", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "app", "study", "all", *args, "--out", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    t0 = time.time()
    try:
        while time.time() - t0 < timeout:
            if proc.poll() is not None:
                raise AssertionError(f"the job ended before it could be killed: {Path(err.name).read_text()[-4000:]}")
            try:
                rows = json.loads((out / "main_job.json").read_text())["studies"]
            except (OSError, ValueError, KeyError):
                rows = []
            if ready(rows):
                proc.send_signal(sig)
                rc = proc.wait(timeout=120)
                err.flush()
                return rc, Path(err.name).read_text()
            time.sleep(0.02)
        raise AssertionError(f"the second study never started: {Path(err.name).read_text()[-4000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()


def _numbers(folder: Path) -> dict:
    rec = json.loads((folder / "result.json").read_text())
    with np.load(folder / "arrays.npz", allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    return {"metrics": rec["metrics"], "summary": rec["summary"], "layers": rec["layers"], "arrays": arrays}


def _close(a, b, path="") -> None:
    """Equal up to float rounding: the killed run captured its store in another process, whose thread
    count may sum in another order (1e-7 differences in the states)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)) or isinstance(a, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, path
        if a.dtype.kind in "fiu" or a.dtype == object and all(isinstance(x, (int, float, type(None))) for x in a.ravel()):
            np.testing.assert_allclose(a.astype(float), b.astype(float), rtol=1e-4, atol=1e-6, err_msg=path)
        else:
            for x, y in zip(a.ravel(), b.ravel()):
                _close(x.item() if hasattr(x, "item") else x, y.item() if hasattr(y, "item") else y, path)
    elif isinstance(a, float) or isinstance(b, float):
        assert (a is None and b is None) or a == pytest.approx(b, rel=1e-4, abs=1e-6), path
    else:
        assert a == b, path


def test_killed_job_resumes_without_redoing_finished_studies(tmp_path):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    _kill_when(killed, ARGS)
    # which study finished, which ran and which waited when the job was killed, as main_job.json said (the order
    # is the job's: cheapest expected first, from the studies' cost hints)
    status = {r["study"]: r["status"] for r in json.loads((killed / "main_job.json").read_text())["studies"]}
    (first,) = [n for n, s in status.items() if s == "ok"]
    (second,) = [n for n, s in status.items() if s == "running"]
    (third,) = [n for n in ONLY.split(",") if n not in (first, second)]
    assert (killed / first / "result.json").is_file()
    assert not (killed / third / "result.json").exists()
    kept = (killed / first / "result.json").stat().st_mtime_ns

    assert main(["study", "all", *ARGS, "--out", str(killed), "--resume"]) == 0
    assert (killed / first / "result.json").stat().st_mtime_ns == kept  # not redone
    rows = {r["study"]: r for r in json.loads((killed / "main_job.json").read_text())["studies"]}
    assert rows[first].get("resumed") is True
    assert not rows[second].get("resumed") and not rows[third].get("resumed")
    assert all(r["status"] == "ok" for r in rows.values())

    assert main(["study", "all", *ARGS, "--out", str(whole)]) == 0
    for study in ONLY.split(","):
        _close(_numbers(killed / study), _numbers(whole / study), study)


def test_killed_parallel_job_resumes(tmp_path):
    """The same on two worker processes: the workers die with the job (no study left running to race
    the resumed one), the finished studies are kept, and the results equal an uninterrupted run's."""
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    args = [a if a != "1" else "2" for a in ARGS]  # --jobs 2
    _kill_when(killed, args, ready=_one_done_one_running)
    done = {r["study"] for r in json.loads((killed / "main_job.json").read_text())["studies"] if r["status"] == "ok"}
    kept = {s: (killed / s / "result.json").stat().st_mtime_ns for s in done}
    assert kept and len(done) < len(ONLY.split(","))

    assert main(["study", "all", *args, "--out", str(killed), "--resume"]) == 0
    assert {s: (killed / s / "result.json").stat().st_mtime_ns for s in done} == kept  # not redone
    rows = {r["study"]: r for r in json.loads((killed / "main_job.json").read_text())["studies"]}
    assert all(r["status"] == "ok" for r in rows.values())
    assert {s for s, r in rows.items() if r.get("resumed")} == done

    assert main(["study", "all", *ARGS, "--out", str(whole)]) == 0
    for study in ONLY.split(","):
        _close(_numbers(killed / study), _numbers(whole / study), study)


def test_sigterm_stops_the_job_as_ctrl_c_does_and_it_resumes(tmp_path):
    """SIGTERM (a scheduler's time limit, kill, a container stopping) on a parallel job: exit 143 with one
    line saying how to go on, no traceback, main_job.json saying it stopped (the explorer shows that, not
    "running"), and --resume keeps the finished studies and ends the rest."""
    out = tmp_path / "job"
    args = [a if a != "1" else "2" for a in ARGS]  # --jobs 2
    rc, err = _kill_when(out, args, ready=_one_done_one_running, sig=signal.SIGTERM)
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    # the last line, with no traceback and no resource-tracker warning after it (workers hold no semaphore)
    assert err.strip().splitlines()[-1] == "lens: stopped by SIGTERM (rerun with --resume to go on)", err[-2000:]
    assert "Traceback" not in err and "leaked semaphore" not in err, err[-2000:]
    job = json.loads((out / "main_job.json").read_text())
    assert job["finished"] is None and job["stopped"].startswith("stopped by SIGTERM at ")
    done = {r["study"] for r in job["studies"] if r["status"] == "ok"}
    assert done and len(done) < len(ONLY.split(","))

    assert main(["study", "all", *args, "--out", str(out), "--resume"]) == 0
    job = json.loads((out / "main_job.json").read_text())
    assert job["finished"] and job["stopped"] is None
    assert all(r["status"] == "ok" for r in job["studies"]) and {r["study"] for r in job["studies"] if r.get("resumed")} == done


def test_resume_reruns_a_study_whose_settings_changed(tmp_path):
    out = tmp_path / "job"
    assert main(["study", "all", *ARGS[:-3], "--only", "linearity", "--quiet", "--out", str(out)]) == 0
    before = (out / "linearity" / "result.json").stat().st_mtime_ns
    assert main(["study", "all", *ARGS[:-3], "--only", "linearity", "--quiet", "--out", str(out), "--resume",
                 "--param", "ridge=0.5"]) == 0
    rec = json.loads((out / "linearity" / "result.json").read_text())
    assert rec["config"]["ridge"] == 0.5
    assert (out / "linearity" / "result.json").stat().st_mtime_ns != before


def test_resume_of_a_single_study_is_refused(tmp_path, capsys):
    assert main(["study", "linearity", "--model", "tiny-llama", "--out", str(tmp_path), "--resume"]) == 2
    assert "--resume" in capsys.readouterr().err
