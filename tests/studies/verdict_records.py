"""Records to judge: a bare result record of one study (no folder behind it) and its one judged row, for the
tests of each study's verdict rules (studies.reporting.headlines.judged reads nothing else)."""

from __future__ import annotations

from pathlib import Path

from studies.reporting.headlines import judged
from studies.reporting.results import ResultRecord


def record(study: str, summary: dict | None = None, metrics: dict | None = None, config: dict | None = None,
           layers: list | None = None) -> ResultRecord:
    """A result record of ``study`` holding only these values (layers: one per metric value when not given)."""
    metrics = metrics or {}
    if layers is None:
        layers = list(range(len(next(iter(metrics.values()))))) if metrics else []
    return ResultRecord(path=Path("."), study=study, model="m", corpus="c", n_tokens=1, config=config or {},
                        layers=layers, metrics=metrics, summary=summary or {})


def judged_row(rec: ResultRecord, measure_start: str = "") -> dict:
    """The one judged row of ``rec`` whose measure starts with ``measure_start`` (fails when not exactly one)."""
    rows = [r for r in judged(rec) if r["measure"].startswith(measure_start)]
    assert len(rows) == 1, [r["measure"] for r in judged(rec)]
    return rows[0]
