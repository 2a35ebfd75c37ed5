"""A running main job as the explorer shows it: which studies are done, running and waiting, and the time left.

Read from ``main_job.json`` as :func:`app.explorer.data.read_job_states` returns it (the job rewrites the file as
each study starts and ends, :mod:`studies.job.main_job`). Nothing here imports Streamlit: the Overview and the
sidebar draw what :func:`progress` returns, and :func:`landed` tells them when a study has finished so that its
result is picked up without a manual reload.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

ACTIVE = ("running", "waiting")  # a row's status while its job runs (studies.job.rows.Status)
# a running job rewrites main_job.json as each study starts and ends: unwritten this long, it may have died
# without a word (kill -9, a power cut), as app.explorer.ui.job_lines says on a study's page
STALE_S = 600


@dataclass(frozen=True)
class JobProgress:
    """One main job: ``run`` (its folder under the results root), ``done`` / ``running`` / ``waiting`` study
    names, ``rows`` (one dict per study for a table), ``left_s`` (the time left, None when no estimate),
    ``elapsed_s``, ``state`` ("running", "stopped" or "finished") and ``stopped`` (why, for a stopped job)."""

    run: str
    state: str
    done: list = field(default_factory=list)
    running: list = field(default_factory=list)
    waiting: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    left_s: float | None = None
    elapsed_s: float = 0.0
    stopped: str | None = None
    updated_s: float = 0.0  # seconds since main_job.json was last written

    @property
    def total(self) -> int:
        return len(self.done) + len(self.running) + len(self.waiting)

    @property
    def active(self) -> bool:
        return self.state == "running"


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def progress(job: dict, now: float | None = None) -> JobProgress:
    """``job`` (one entry of :func:`app.explorer.data.read_job_states`) as a :class:`JobProgress`. The time left
    is, as the job's own progress line estimates it (:func:`studies.job.main_job.progress_line`), what the
    running studies have left of their estimates plus the waiting ones' estimates, spread over the job's
    workers; None when a study still to run has no estimate."""
    now = time.time() if now is None else now
    state = "finished" if job.get("finished") else ("stopped" if job.get("stopped") else "running")
    done, running, waiting, failed, rows = [], [], [], [], []
    todo_s, unknown = 0.0, False
    for r in job.get("studies", []):
        study, status = str(r.get("study")), str(r.get("status"))
        est = _number(r.get("estimate_s"))
        row = {"study": study, "status": status, "seconds": _number(r.get("seconds")), "estimate (s)": est,
               "summary": r.get("line") or ""}
        if status == "running":
            running.append(study)
            started = _number(r.get("started"))
            ran = max(0.0, now - started) if started is not None else None
            row["seconds"] = None if ran is None else round(ran, 1)
            if est is None:
                unknown = True
            else:
                todo_s += max(0.0, est - (ran or 0.0))
        elif status == "waiting":
            waiting.append(study)
            if est is None:
                unknown = True
            else:
                todo_s += est
        else:
            done.append(study)
            if status == "failed":
                failed.append(study)
        rows.append(row)
    workers = max(1, int(_number(job.get("jobs")) or 1))
    todo = len(running) + len(waiting)
    left = None if unknown or state != "running" else todo_s / max(1, min(workers, todo or 1))
    return JobProgress(run=str(job.get("run")), state=state, done=done, running=running, waiting=waiting,
                       failed=failed, rows=rows, left_s=left, elapsed_s=float(job.get("elapsed_s") or 0.0),
                       stopped=job.get("stopped"), updated_s=float(job.get("updated_s") or 0.0))


def landed(jobs: list[dict]) -> frozenset:
    """What has finished in ``jobs``: (run, study, status) for every row no longer running or waiting, and
    (run, "", state) per job. It changes exactly when a study finishes, fails or a job ends — the moment a
    page must read the results again."""
    out = set()
    for job in jobs:
        p = progress(job)
        out.add((p.run, "", p.state))
        out.update((p.run, r["study"], r["status"]) for r in p.rows if r["status"] not in ACTIVE)
    return frozenset(out)


def headline(p: JobProgress, clock) -> str:
    """One line: ``main job in `smol`: 3 of 12 studies done · running senses · 8 waiting · about 4 min left``
    (``clock`` formats seconds)."""
    parts = [f"{len(p.done)} of {p.total} studies done"]
    if p.failed:
        parts.append(f"{len(p.failed)} failed")
    if p.running:
        parts.append("running " + ", ".join(p.running))
    if p.waiting:
        parts.append(f"{len(p.waiting)} waiting")
    parts.append(f"about {clock(p.left_s)} left" if p.left_s is not None else "time left not known yet")
    line = f"main job in `{p.run}` running for {clock(p.elapsed_s)}: " + " · ".join(parts)
    if p.updated_s > STALE_S:
        line += (f" (main_job.json last written {clock(p.updated_s)} ago: if the job died, the same command with "
                 "--resume keeps the finished studies)")
    return line
