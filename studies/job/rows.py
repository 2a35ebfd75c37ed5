"""The main job's rows: one per study, as ``main_job.json`` lists them (:mod:`studies.job.main_job` writes them,
:mod:`studies.reporting.report` and the explorer read the file), and the file itself as a frozen value
(:class:`MainJobRecord`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from lens.errors import LensInputError
from lens.runtime.frozen_json import FrozenDict, freeze, ordered, thaw

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


# main_job.json's fields in the order the job writes them (studies.job.main_job._write_job)
JOB_ORDER = ("model", "corpus", "max_tokens", "store", "capture_s", "wall_time_s", "jobs", "studies", "params",
             "machine", "cpu_features", "finished", "stopped")
_JOB_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,), "corpus": (str,), "store": (str,), "machine": (str,), "finished": (str,), "stopped": (str,),
    "max_tokens": (int, float), "capture_s": (int, float), "wall_time_s": (int, float), "jobs": (int,),
    "params": (dict,), "cpu_features": (list,)}


@dataclass(frozen=True)
class MainJobRecord:
    """``main_job.json`` as a frozen value (issue #41): parsed and checked once (:meth:`from_dict`), written back
    key for key (:meth:`to_dict`). ``studies`` holds the rows as the file does (frozen JSON objects; a row that
    is not an object is kept and skipped by :attr:`rows`); a field the file lacks is None and not written back;
    one this version does not know is kept in ``unknown``. ``finished``: when the job finished (None while it
    runs or after it stopped); ``stopped``: why it ended unfinished (Ctrl-C, SIGTERM)."""

    studies: tuple = ()
    model: str | None = None
    corpus: str | None = None
    max_tokens: float | None = None
    store: str | None = None
    capture_s: float | None = None
    wall_time_s: float | None = None
    jobs: int | None = None
    params: Mapping[str, Any] | None = None
    machine: str | None = None
    cpu_features: tuple | None = None
    finished: str | None = None
    stopped: str | None = None
    unknown: Mapping[str, Any] = field(default_factory=FrozenDict)
    key_order: tuple[str, ...] = field(default=(), repr=False, compare=False)
    absent: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Any, where: str = JOB_FILE) -> "MainJobRecord":
        """The job ``data`` (the JSON value of ``where``) records; ``LensInputError("<where> ...")``, one line,
        when it is not a JSON object with a list of studies and fields of the types the job writes."""
        if not isinstance(data, dict):
            raise LensInputError(f"{where} is not a main job's record: expected a JSON object, got "
                                 f"{type(data).__name__}")
        if not isinstance(data.get("studies", []), list):
            raise LensInputError(f"{where} is not a main job's record: studies must be a list, got "
                                 f"{type(data['studies']).__name__}")
        for key, types in _JOB_TYPES.items():
            value = data.get(key)
            if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
                raise LensInputError(f"{where} is not a main job's record: {key} must be "
                                     f"{' or '.join(t.__name__ for t in types)} or null, got {type(value).__name__}")
        known = {k: freeze(data[k]) for k in JOB_ORDER if k in data}
        if "cpu_features" in known:
            known["cpu_features"] = tuple(known["cpu_features"])
        if "studies" in known:
            known["studies"] = tuple(known["studies"])
        return cls(**known, unknown=freeze({k: v for k, v in data.items() if k not in JOB_ORDER}),
                   key_order=tuple(data), absent=frozenset(k for k in JOB_ORDER if k not in data))

    def to_dict(self) -> dict:
        """The JSON object (fresh, mutable), key for key as read (in the job's order when built here)."""
        values = {k: thaw(getattr(self, k)) for k in JOB_ORDER if k not in self.absent}
        values.update((k, thaw(v)) for k, v in self.unknown.items())
        return ordered(values, self.key_order or JOB_ORDER)

    @classmethod
    def read(cls, file) -> "MainJobRecord":
        """``file`` read and checked; unreadable, not JSON or not a job's record: one LensInputError line."""
        file = Path(file)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise LensInputError(f"{file} cannot be read ({exc.strerror or exc})") from None
        except (ValueError, RecursionError):  # not UTF-8, not JSON, nested past reason
            raise LensInputError(f"{file} is not JSON") from None
        return cls.from_dict(data, str(file))

    @property
    def has_studies(self) -> bool:
        """Whether the file lists its studies (every job writes the list; a file without one is not a job's)."""
        return "studies" not in self.absent

    @property
    def rows(self) -> dict[Any, Mapping[str, Any]]:
        """study -> its row (the rows that are JSON objects; frozen)."""
        return {r.get("study"): r for r in self.studies if isinstance(r, dict)}

    def row_list(self) -> list[Mapping[str, Any]]:
        """The rows that are JSON objects, in the file's order."""
        return [r for r in self.studies if isinstance(r, dict)]
