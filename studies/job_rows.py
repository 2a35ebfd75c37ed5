"""The main job's rows: one per study, as ``main_job.json`` lists them (:mod:`studies.main_job` writes them,
:mod:`studies.report` and the explorer read the file)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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
    (``studies.main_job._halt``) and never written."""

    study: str
    status: Status
    out: str
    seconds: float | None = None
    line: str = ""
    error: str | None = None
    resumed: bool = False
    halt: list | None = None

    def to_json(self) -> dict:
        """The row as ``main_job.json`` holds it (``resumed`` only when true)."""
        row = {"study": self.study, "status": self.status.value, "seconds": self.seconds, "out": self.out,
               "line": self.line, "error": self.error}
        if self.resumed:
            row["resumed"] = True
        return row
