"""The main job: every available study on one model and corpus, one shared store, one report.

``lens study all --model M --corpus C --out DIR`` lays out::

    DIR/store/            # captured once: every site the selected studies declare (all layers)
    DIR/<study>/          # one results folder per study
    DIR/main_job.json     # what ran: status, wall time and error per study, total wall time
    DIR/report.html       # studies.reporting.report.build_report(DIR)

The shared store holds the union of the sites the selected studies declare (``Study.needs``) that the
model's family has; a study whose needs a reused store does not meet (``--store`` of another run)
gets a store of its own under ``DIR/<study>/store``. A failing study does not stop the others: its
error is recorded and the job raises :class:`StudiesFailed` at the end (the CLI exits 1), after the
report has been written. A study that does not apply to the model (:class:`lens.errors.ModelLacks`:
the logit lens of an encoder, a site the family has not) is recorded as ``n/a`` with the reason; it is
not a failure.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lens.errors import LensInputError, ModelLacks, StoreWriteError, Terminated
from lens.runtime.progress import tqdm  # tqdm.auto, imported quietly (lens.runtime.progress says why)
from lens.runtime.threads import available_cores, configured_threads
from lens.store.writer import take_writer_lock
from studies.core import registry  # registry.get_study: looked up when called (a test swaps it)
from studies.core.runner import run_study
from studies.job.pool import Chain, plan_chains, run_chains
# the job's preparation (selection, configs, the shared store) lives in studies.job.prepare; its names stay here
from studies.job.prepare import (  # noqa: F401
    _check_configs, _configs, _fitted, _refuse_foreign_store, _shared_store, _shared_store_path, select_studies,
    shared_config,
)
from studies.job.rows import JOB_FILE, JobRow, MainJobRecord, Status
from studies.reporting.headlines import one_line
from studies.reporting.report import build_report
from studies.reporting.results import (RESULT_FILE, _clean, cpu_features, machine_line, read_result,
                                       require_results_folder, write_json_file)

if TYPE_CHECKING:
    from studies.core.config import StudyConfig

log = logging.getLogger(__name__)

# a study's status in main_job.json
OK, NOT_APPLICABLE, FAILED = Status.OK, Status.NOT_APPLICABLE, Status.FAILED  # the row statuses (studies.job.rows)


class StudiesFailed(RuntimeError):
    """Some studies failed; ``rows`` holds every study's outcome (as ``main_job.json`` lists it)."""

    def __init__(self, rows: list[dict]):
        self.rows = rows
        failed = [r for r in rows if r["status"] == FAILED]
        detail = "; ".join(f"{r['study']} ({r['error']})" for r in failed)
        super().__init__(f"{len(failed)} of {len(rows)} studies failed: {detail}")


# config fields that change how a study runs, not what it computes: a result made with another value
# of these is still this config's result
RUN_ONLY_FIELDS = ("progress",)


def finished_result(study, config, folder: Path):
    """The study's result in ``folder`` when it is complete (``result.json`` is written last), readable
    and was computed with ``config`` (every field but :data:`RUN_ONLY_FIELDS`); else None."""
    try:
        rec = read_result(folder)
        rec.arrays()  # the arrays file must read back too
    except Exception:  # noqa: BLE001 - any damage means: run the study again
        return None
    want = {k: v for k, v in _clean(config).items() if k not in RUN_ONLY_FIELDS}
    have = {k: v for k, v in rec.config.items() if k not in RUN_ONLY_FIELDS}
    return rec if rec.study == study.name and want == have else None


def _run_one(study, config, out: Path) -> JobRow:
    t0 = time.time()
    name = study.name
    row = JobRow(name, OK, str(out / name))
    # a result folder is complete once result.json exists: remove an older one first, so that a run
    # killed while rewriting the folder never leaves a stale result beside new arrays
    (out / name / RESULT_FILE).unlink(missing_ok=True)
    try:
        run_study(study, config, out / name)
        row.line = one_line(read_result(out / name))
    except ModelLacks as exc:  # the study does not apply to this model: say why, go on
        log.info("study %s does not apply: %s", name, exc)
        row.status, row.error, row.line = NOT_APPLICABLE, str(exc), f"not applicable: {exc}"
    except (OSError, StoreWriteError) as exc:  # the machine, not the study: the next study would hit it too
        log.info("study %s stopped the job: %s", name, exc)
        row.status, row.error = FAILED, f"{type(exc).__name__}: {exc}"
        row.line, row.halt = f"FAILED {row.error}", _halt(exc)
    except Exception as exc:  # a failing study must not stop the others; it is reported at the end
        if isinstance(exc, LensInputError) and not os.environ.get("LENS_DEBUG"):
            log.error("study %s failed: %s", name, exc)  # what the input lacks, in one line: no traceback to read
        else:
            log.exception("study %s failed", name)
        row.status, row.error = FAILED, f"{type(exc).__name__}: {exc}"
        row.line = f"FAILED {row.error}"
    row.seconds = round(time.time() - t0, 2)
    return row


def _halt(exc: BaseException) -> list:
    """What stops the whole job, in a form a worker can send back: an OSError's errno, text and file, or
    a store write error's message (:func:`_raise_halt` raises it again in the job's process)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return ["os", exc.errno, exc.strerror or str(exc), exc.filename]
    return ["input", str(exc)]


def _raise_halt(halt: list) -> None:
    """Raise again, in the job's process, what :func:`_halt` sent back."""
    if halt[0] == "os":
        _, number, text, filename = halt
        raise OSError(number, text, filename)
    raise StoreWriteError(halt[1])


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}:{s:02d}"


def _previous_seconds(out: Path, shared) -> dict:
    """Each study's wall time in the last job written to ``out`` with the same model, corpus and
    token budget: the estimate for the studies still waiting."""
    try:
        job = MainJobRecord.read(out / JOB_FILE)
    except LensInputError:  # none yet, or not readable: no estimate
        return {}
    if any(getattr(job, k) != getattr(shared, k) for k in ("model", "corpus", "max_tokens")):
        return {}
    return {r["study"]: r["seconds"] for r in job.row_list()
            if r.get("status") == OK and r.get("seconds") and not r.get("resumed")}


def progress_line(rows: list[JobRow], names: list[str], running: list[str], t_start: float,
                  estimates: dict, workers: int = 1) -> str:
    """One terminal line: how many studies are done / running / waiting, elapsed time, and an estimate
    of the time left (earlier runs' times at these settings, else the mean of this run's), spread
    over ``workers`` parallel workers."""
    finished = {r.study for r in rows}
    waiting = [n for n in names if n not in finished and n not in running]
    ran = [r.seconds for r in rows if r.seconds and not r.resumed]
    mean = sum(ran) / len(ran) if ran else None
    left = None
    todo = waiting + list(running)
    if mean is not None or all(n in estimates for n in todo):
        left = sum(estimates.get(n, mean or 0) for n in todo) / max(1, min(workers, len(todo) or 1))
    state = "running " + ", ".join(running) if running else "finished"
    return (f"[{len(finished)}/{len(names)} done · {state} · {len(waiting)} waiting] "
            f"elapsed {_clock(time.time() - t_start)}, left ~{_clock(left)}")


def _write_job(out: Path, shared, params: dict, rows: list[JobRow], names: list[str], t_start: float,
               capture_s: float | None, finished: bool, running=(), jobs: int = 1, since=None,
               estimates=None, stopped: str | None = None) -> None:
    """main_job.json as it stands: one row per study in registry order — done, running or waiting; a
    running study's row has ``started`` (epoch seconds, from ``since``), and a running or waiting one
    ``estimate_s`` (from ``estimates``: earlier runs at these settings, else the study's declared cost).
    ``stopped``: why the job ended before finishing (Ctrl-C, SIGTERM), and how to go on; None while it runs."""
    done = {r.study: r for r in rows}
    listed = []
    for n in names:
        if n in done:
            listed.append(done[n].to_json())
        elif not finished:
            listed.append(JobRow(n, Status.RUNNING if n in running else Status.WAITING, str(out / n),
                                 started=(since or {}).get(n) if n in running else None,
                                 estimate_s=(estimates or {}).get(n)).to_json())
    job = {"model": shared.model, "corpus": shared.corpus, "max_tokens": shared.max_tokens,
           "store": shared.store, "capture_s": capture_s, "wall_time_s": round(time.time() - t_start, 2),
           "jobs": jobs, "studies": listed, "params": {k: str(v) for k, v in params.items()},
           "machine": machine_line(), "cpu_features": cpu_features(),
           "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z") if finished else None, "stopped": stopped}
    write_json_file(out / JOB_FILE, MainJobRecord.from_dict(job).to_dict())  # the record its readers will get


# workers a parallel job starts at most by default: past this, a study's own threads serve it better
MAX_AUTO_JOBS = 4


def resolve_jobs(jobs, n_chains: int, device: str = "cpu") -> tuple[int, int]:
    """(worker processes, threads each) for ``jobs`` ("auto"/None/0: one per core this process may
    use — :func:`lens.runtime.threads.configured_threads` — at most :data:`MAX_AUTO_JOBS` and one per chain;
    one on an accelerator, whose memory the workers would share)."""
    cores = configured_threads() or available_cores()
    if jobs in (None, "auto") or (isinstance(jobs, str) and jobs.strip().lower() == "auto"):
        jobs = 1 if not str(device).startswith("cpu") else min(cores, MAX_AUTO_JOBS)
    try:
        jobs = int(jobs)
    except (TypeError, ValueError):
        raise LensInputError(f"--jobs: expected a positive number or 'auto', got {jobs!r}") from None
    if jobs < 1:
        raise LensInputError(f"--jobs: expected a positive number or 'auto', got {jobs}")
    jobs = max(1, min(jobs, n_chains))
    return jobs, max(1, cores // jobs)


def run_named(name: str, config, out: Path) -> JobRow:
    """:func:`_run_one` of the registered study ``name`` (what a parallel job's workers run)."""
    return _run_one(registry.get_study(name), config, out)


def _failed_row(out: Path, name: str, error: str) -> JobRow:
    return JobRow(name, FAILED, str(out / name), line=f"FAILED {error}", error=error)


@dataclass(frozen=True)
class _Plan:
    """What a job runs, settled before anything is loaded or written: the studies in registry order, their
    checked configs, each one's expected seconds and the workers that run them."""

    names: list
    studies: dict
    shared: StudyConfig  # the shared settings (its store: the one given, None until captured)
    configs: dict
    params: dict
    estimates: dict  # each study's wall time in the last job at these settings (_previous_seconds)
    seconds: dict  # expected wall time: those, else the study's declared cost
    n_jobs: int
    threads: int


def _schedule(base, out: Path, only, params: dict, progress: bool, jobs, targets: dict | None = None) -> _Plan:
    """The studies to run, their configs (each checked: a bad ``--param`` is refused here) and the workers."""
    names = select_studies(only)
    if not names:
        raise LensInputError("no studies are available to run")
    studies = {n: registry.get_study(n) for n in names}
    shared = shared_config(base)
    shared = dataclasses.replace(shared, progress=shared.progress and progress)
    configs = _configs(studies, shared, params, targets)
    _check_configs(studies, configs)
    require_results_folder(out, shared.store)
    _refuse_foreign_store(shared, out)
    estimates = _previous_seconds(out, shared)
    seconds = {n: estimates.get(n, studies[n].cost) for n in names}
    chains = plan_chains(names, {n: studies[n].worker_group for n in names}, seconds)
    n_jobs, threads = resolve_jobs(jobs, len(chains), shared.device or "cpu")
    return _Plan(names, studies, shared, configs, params, estimates, seconds, n_jobs, threads)


class _Job:
    """A job as it runs: the rows so far, the studies running and what halts it. ``main_job.json`` is rewritten
    as each study starts and ends, the report as each one ends. A full disk or a read-only folder, met by a study
    or by writing those files, halts the job: no other study starts, those running finish, and the job ends
    with it (exit 2, one line)."""

    def __init__(self, plan: _Plan, out: Path, progress: bool, t_start: float):
        self.plan, self.out, self.progress, self.t_start = plan, out, progress, t_start
        self.shared, self.capture_s, self.fitted = plan.shared, None, {}
        self.rows: list[JobRow] = []
        self.running: list[str] = []
        self.since: dict = {}  # study -> when it started (main_job.json: the explorer's "running for 3 min")
        self.halts: list[list] = []  # what halted the job (_halt), the first one raised at the end

    def say(self, text: str) -> None:
        if self.progress:
            tqdm.write(text, file=sys.stderr)

    def write_state(self, stopped: str | None = None) -> bool:
        """main_job.json as it stands; False when the folder cannot be written, which halts the job
        (rather than raising inside the worker pool, which would have to kill the studies running)."""
        p = self.plan
        try:
            _write_job(self.out, self.shared, p.params, self.rows, p.names, self.t_start, self.capture_s,
                       finished=False, running=self.running, jobs=p.n_jobs, since=self.since,
                       estimates=p.seconds, stopped=stopped)
            return True
        except OSError as exc:
            self.halts.append(_halt(exc))
            return False

    def capture(self) -> None:
        """The shared store (captured once) and each study's config fitted to it."""
        p = self.plan
        t_capture = time.time()
        store = _shared_store(self.shared, self.out, p.studies, p.configs, self.progress)
        self.shared = dataclasses.replace(self.shared, store=store)
        self.capture_s = round(time.time() - t_capture, 2)
        self.fitted = {n: _fitted(p.studies[n], p.configs[n], store, self.out) for n in p.names}

    def started(self, name: str) -> None:
        self.running.append(name)
        self.since[name] = round(time.time(), 1)
        self.say(progress_line(self.rows, self.plan.names, self.running, self.t_start, self.plan.estimates,
                               self.plan.n_jobs))
        if not self.halts:
            self.write_state()

    def ended(self, row: JobRow) -> None:
        if row.study in self.running:
            self.running.remove(row.study)
        if row.halt:  # main_job.json keeps that study as "running": --resume runs it again
            self.halts.append(row.halt)
            return
        self.rows.append(row)
        text = f"{row.study:<17} {row.status:<6} {row.seconds or 0:>7.1f} s  {row.line}"
        if row.resumed:
            text += "  (kept from an earlier run)"
        log.info(text)
        self.say(text)
        if self.halts or not self.write_state():
            return
        if not row.resumed or len(self.rows) == len(self.plan.names):
            try:
                build_report(self.out)  # each study shows as soon as it finishes
            except OSError as exc:
                self.halts.append(_halt(exc))

    def keep_finished(self, resume: bool) -> list[str]:
        """The studies to run: with ``resume``, those whose result is finished (:func:`finished_result`) are
        rows at once and only the rest is scheduled."""
        todo = []
        for name in self.plan.names:
            rec = finished_result(self.plan.studies[name], self.fitted[name], self.out / name) if resume else None
            if rec is not None:
                self.ended(JobRow(name, OK, str(self.out / name), seconds=round(rec.wall_time_s, 2), line=one_line(rec),
                                  resumed=True))
            else:
                todo.append(name)
        return todo

    def run_in_order(self, todo: list[str]) -> None:
        """One study after another in this process, cheapest first (the expected seconds; ties in registry order)."""
        for name in sorted(todo, key=lambda n: (self.plan.seconds.get(n, 0.0), self.plan.names.index(n))):
            if self.halts:
                break
            self.started(name)
            self.ended(_run_one(self.plan.studies[name], self.fitted[name], self.out))

    def run_in_workers(self, todo: list[str]) -> None:
        """The studies on :attr:`_Plan.n_jobs` worker processes (:mod:`studies.job.pool`), progress bars off."""
        p, out = self.plan, self.out
        quiet = {n: dataclasses.replace(self.fitted[n], progress=False) for n in todo}
        chains = [Chain(items=[(n, (quiet[n], out)) for n in c]) for c in
                  plan_chains(todo, {n: p.studies[n].worker_group for n in todo}, p.seconds, p.n_jobs)]
        run_chains(chains, run_named, jobs=p.n_jobs, threads=p.threads, on_start=self.started, on_row=self.ended,
                   failed_row=lambda name, error: _failed_row(out, name, error), stop=lambda: bool(self.halts))

    def finish(self) -> list[dict]:
        """Raise what halted the job, else write the finished main_job.json and the report; the rows as
        ``main_job.json`` lists them (:class:`StudiesFailed` when any study failed)."""
        if self.halts:
            _raise_halt(self.halts[0])
        p = self.plan
        self.rows.sort(key=lambda r: p.names.index(r.study))
        _write_job(self.out, self.shared, p.params, self.rows, p.names, self.t_start, self.capture_s,
                   finished=True, jobs=p.n_jobs)
        report = build_report(self.out)
        log.info("wrote %s (%.1f s in all)", report, time.time() - self.t_start)
        self.say(progress_line(self.rows, p.names, [], self.t_start, p.estimates, p.n_jobs))
        rows = [r.to_json() for r in self.rows]
        if any(r.status == FAILED for r in self.rows):
            raise StudiesFailed(rows)
        return rows


def run_all(base, out_dir, only=None, params: dict | None = None, progress: bool = True,
            resume: bool = False, jobs=None, targets: dict | None = None) -> list[dict]:
    """Run every available study (or those in ``only``) and write ``out_dir/report.html``.

    ``base``: the shared settings, a :class:`studies.core.config.StudyConfig` (or a dict of its fields: model,
    corpus, max_tokens, seq_len, batch_size, device, store, seed, progress, ...; :func:`shared_config`);
    ``params``: study-specific fields, each given to the studies that have it.
    ``resume``: keep the studies whose results in ``out_dir`` are complete and were computed with the
    same config (:func:`finished_result`), and continue an interrupted shared capture.
    ``jobs``: worker processes for the studies (:func:`resolve_jobs`; 1 = one after another in this
    process; more: :mod:`studies.job.pool`, each worker with its share of the cores, per-study
    progress bars off and a line per study instead).
    ``targets``: {study: half-width} from ``--precision`` (each study's sample sized to reach it).
    ``main_job.json`` and the report are rewritten after every study, so both show each study as soon
    as it finishes. Returns one row per study {study, status, seconds, out, line, error} (a
    :class:`studies.job.rows.JobRow` as ``main_job.json`` holds it), in registry order; raises
    :class:`StudiesFailed` after writing the report when any study failed.
    """
    t_start = time.time()
    out = Path(out_dir)
    plan = _schedule(base, out, only, dict(params or {}), progress, jobs, targets)

    # one job per results folder (made only now: a refused job leaves no folder behind); a second job on it is
    # refused naming the first, which would otherwise find its studies rewritten under it
    lock, _ = take_writer_lock(out, work="main job")
    try:
        job = _Job(plan, out, progress, t_start)
        _write_job(out, plan.shared, plan.params, [], plan.names, t_start, None, finished=False, jobs=plan.n_jobs,
                   estimates=plan.seconds)
        try:
            job.capture()
            todo = job.keep_finished(resume)
            if plan.n_jobs <= 1:
                job.run_in_order(todo)
            else:
                job.run_in_workers(todo)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (lens.errors.Terminated): say so in main_job.json
            how = "stopped by SIGTERM" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"
            job.write_state(stopped=f"{how} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}; the same command with "
                                    "--resume keeps the finished studies and runs the rest")
            raise
        return job.finish()
    finally:
        lock.release()
