"""The main job's rows: one per study, as ``main_job.json`` lists them (:mod:`studies.job.main_job` writes them,
:mod:`studies.reporting.report` and the explorer read the file)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

JOB_FILE = "main_job.json"  # the file in a main job's folder that lists these rows


class Status(StrEnum):
    """A study's status in ``main_job.json`` (the value is what the file holds)."""

    OK = "ok"
    NOT_APPLICABLE = "n/a"  # the study does not apply to the model (lens.errors.ModelLacks): not a failure
    FAILED = "failed"
    RUNNING = "running"  # only while the job runs
    WAITING = "waiting"  # only while the job runs


@dataclass
class JobRow:
    """One study's outcome. ``line`` is its one-line summary (or why it failed / does not apply); ``resumed``:
    kept from an earlier run (``--resume``); ``halt``: what stops the whole job, sent back by a worker
    (``studies.job.main_job._halt``) and never written. A study still running or waiting has ``started`` (epoch
    seconds, running only) and ``estimate_s`` (its expected wall time), written for those two only."""

    study: str
    status: Status
    out: str
    seconds: float | None = None
    line: str = ""
    error: str | None = None
    resumed: bool = False
    halt: list | None = None
    started: float | None = None
    estimate_s: float | None = None

    def to_json(self) -> dict:
        """The row as ``main_job.json`` holds it (``started`` and ``estimate_s`` only while it runs or waits,
        ``resumed`` only when true)."""
        row = {"study": self.study, "status": self.status.value, "seconds": self.seconds, "out": self.out,
               "line": self.line, "error": self.error}
        if self.status in (Status.RUNNING, Status.WAITING):
            row.update(started=self.started, estimate_s=self.estimate_s)
        if self.resumed:
            row["resumed"] = True
        return row
