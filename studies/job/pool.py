"""Run the main job's studies in worker processes, each with its share of the cores.

Why processes: a study is a sequence of phases, and many of them do not keep two cores busy — small
LAPACK factorisations run on one thread on purpose (:func:`lens.runtime.threads.serial`), scikit-learn and
numpy loops, tokenisation, figure writing. A serial ``lens study all`` on 2 cores used 1.6 cores on
average (``make demo`` under ``time``: 21.8 CPU-minutes in 13.5 minutes). With ``j`` workers of
``cores // j`` threads each, one study's single-threaded phase overlaps another's, and each pool is
still sized once per process and never nested (:mod:`lens.runtime.threads`).

Scheduling is list scheduling over an order (:func:`plan_chains`) that serves two ends: the longest studies
start at once, one per worker but the last, which first runs the cheapest (results land in the first minute)
and then the rest longest first (so no long study is left to run alone at the end); each free worker takes the
next. Expected seconds are an earlier run's at the same settings, else the study's ``cost`` hint. Studies with the same ``Study.worker_group`` form one chain that runs, in registry
order, in one worker, so they share what that process keeps in memory (:mod:`lens.readout.store_lens`: a
store row's logit lens is decoded once for prediction gains and the logit-lens study).

A worker dies with the job: on Linux it asks the kernel for SIGKILL when its parent exits
(``PR_SET_PDEATHSIG``), so a killed ``lens study all`` leaves no study running that a ``--resume``
could race with; elsewhere a worker notices a closed pipe at its next message. A worker that dies
mid-study (killed, out of memory) fails that study alone; the next study gets a fresh worker.

Results are exchanged over multiprocessing pipes between our own processes (configs and rows);
nothing a user hands in is unpickled.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing as mp
import os
import signal
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Callable
import threading
from tqdm import tqdm

from lens.runtime.threads import child_environment, configure_threads

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


@dataclass
class Chain:
    """Studies that run one after another in one worker: ``items`` are (name, args) pairs, ``args``
    the positional arguments of the run function after the study name; ``seconds`` the expected
    total (for the order)."""

    items: list
    seconds: float = 0.0


@dataclass
class _Worker:
    process: mp.process.BaseProcess
    conn: object
    chain: Chain | None = None
    current: str | None = None
    queue: list = field(default_factory=list)


#: the cheap studies that run before the longest-first order, up to this many expected seconds in all (at least
#: one): the first results land within a minute of the capture
FIRST_RESULTS_S = 60.0


def plan_chains(names: list[str], groups: dict[str, str | None], seconds: dict[str, float],
                jobs: int = 1) -> list[list[str]]:
    """``names`` (registry order) cut into chains — one per worker group, one per ungrouped study — and ordered
    for ``jobs`` workers; a chain's studies run cheapest first.

    With one worker the chains run cheapest expected total first (issue #38: the first results land within a
    minute or two, and the report fills from the cheap end). With ``jobs`` > 1 the ``jobs - 1`` longest chains go
    first, longest first, each starting at once on a worker of its own; the last worker takes the cheapest chains
    up to :data:`FIRST_RESULTS_S` expected seconds (the first results), and then the rest run longest first, as list
    scheduling wants (a long chain left to the end runs alone while the other workers idle: on 2 cores the tuned
    lens' minutes after every other study had finished, then the store lens' chain). Ties keep registry order."""
    chains: dict[str, list[str]] = {}
    for n in sorted(names, key=lambda n: (seconds.get(n, 0.0), names.index(n))):
        chains.setdefault(groups.get(n) or f"\0{n}", []).append(n)

    def total(c: list[str]) -> float:
        return sum(seconds.get(n, 0.0) for n in c)

    cheapest = sorted(chains.values(), key=lambda c: (total(c), names.index(c[0])))
    if jobs <= 1 or not any(seconds.get(n) for n in names) or len(cheapest) <= jobs:
        return cheapest
    longest_first = sorted(cheapest, key=lambda c: (-total(c), names.index(c[0])))
    started, rest = longest_first[:jobs - 1], longest_first[jobs - 1:]
    first: list[list[str]] = []
    for c in reversed(rest):  # cheapest first
        if first and sum(map(total, first)) + total(c) > FIRST_RESULTS_S:
            break
        first.append(c)
    return started + first + [c for c in rest if c not in first]


def _die_with_parent(parent: int) -> None:
    """SIGKILL for this process when ``parent`` (the job's pid) exits; leave now if it already has."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError) as exc:  # pragma: no cover - a libc without prctl
        log.debug("prctl(PR_SET_PDEATHSIG) unavailable: %s", exc)
    # the parent died before the request took effect: we were handed to init or, under a subreaper
    # (a container's init, a CI runner, systemd), to that process — so compare pids, not ppid with 1
    if os.getppid() != parent:
        os._exit(1)


def _worker_main(conn, run_one: Callable, log_level: int, parent: int) -> None:
    """A worker's loop: (name, args) in, run_one(name, *args)'s row out; None ends it."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it ends us
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    # tqdm would make a multiprocessing lock (a named semaphore, registered with the job's resource tracker);
    # a worker ended with the job (Ctrl-C, SIGTERM) never unlinks it and the tracker warns at exit. Bars are
    # off in workers and threads are all a worker has: a thread lock does.

    tqdm.set_lock(threading.RLock())

    configure_threads()  # from LENS_NUM_THREADS, set by the parent for this worker
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        name, args = msg
        conn.send(run_one(name, *args))


@contextmanager
def _child_environment(threads: int):
    """os.environ as spawned workers must start with: every pool at ``threads`` from the first import."""
    env = child_environment(threads)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def _main_not_rerun():
    """Hide the parent's ``__main__`` while a worker is spawned. Spawning re-runs it in the child to
    find what was defined there; the run function is importable, and a ``__main__`` that is a
    notebook kernel, a Streamlit page or a test runner must not run again in every worker."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


class _Pool:
    """The workers of one :func:`run_chains` call, and the chains they have still to run."""

    def __init__(self, chains: list[Chain], run_one: Callable, threads: int, on_start: Callable[[str], None],
                 on_row: Callable, failed_row: Callable[[str, str], object], stop: Callable[[], bool]):
        self.ctx = mp.get_context("spawn")
        self.pending = list(chains)
        self.workers: list[_Worker] = []
        self.rows: list = []
        self.run_one, self.threads = run_one, threads
        self.on_start, self.on_row, self.failed_row, self.stop = on_start, on_row, failed_row, stop

    def start_worker(self) -> _Worker:
        parent, child = self.ctx.Pipe()
        with _child_environment(self.threads), _main_not_rerun():
            p = self.ctx.Process(target=_worker_main,
                                 args=(child, self.run_one, logging.getLogger().level, os.getpid()),
                                 name="lens-study-worker", daemon=True)
            p.start()
        child.close()
        w = _Worker(process=p, conn=parent)
        self.workers.append(w)
        return w

    def feed(self, w: _Worker) -> None:
        """Give ``w`` its chain's next study, or the next chain's first (nothing when none is left)."""
        if self.stop():
            w.queue = []
            self.pending.clear()
            return
        if not w.queue:
            if not self.pending:
                return
            w.chain = self.pending.pop(0)
            w.queue = list(w.chain.items)
        name, args = w.queue.pop(0)
        w.current = name
        self.on_start(name)
        try:
            w.conn.send((name, args))
        except (OSError, ValueError):  # it died before it could take the study
            self.lost(w)

    def lost(self, w: _Worker) -> None:
        """``w`` died running ``w.current``: that study fails; the rest of its chain goes first to a
        fresh worker."""
        w.process.join(timeout=5)
        row = self.failed_row(w.current, f"the worker process running it died (exit code {w.process.exitcode})")
        self.workers.remove(w)
        rest, w.queue, w.current = w.queue, [], None
        self.rows.append(row)
        self.on_row(row)
        if rest:
            self.pending.insert(0, Chain(items=rest))
        if self.pending:
            self.feed(self.start_worker())

    def run(self, jobs: int) -> None:
        """Start ``jobs`` workers (at most one per chain) and take their rows until every study has run."""
        for _ in range(min(jobs, len(self.pending))):
            self.feed(self.start_worker())
        while any(w.current for w in self.workers):
            busy = {w.conn: w for w in self.workers if w.current}
            for conn in wait(list(busy)):
                w = busy[conn]
                try:
                    row = conn.recv()
                except (EOFError, OSError):
                    self.lost(w)
                    continue
                w.current = None
                self.rows.append(row)
                self.on_row(row)
                self.feed(w)

    def close(self, done: bool) -> None:
        """Idle workers are told to stop; after an error or Ctrl-C (``done`` false), busy ones are killed."""
        for w in self.workers:
            if done:
                try:
                    w.conn.send(None)
                except (OSError, ValueError):
                    pass
            else:
                w.process.kill()
        for w in self.workers:
            w.process.join(timeout=10)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()


def run_chains(chains: list[Chain], run_one: Callable, *, jobs: int, threads: int,
               on_start: Callable[[str], None] = lambda name: None,
               on_row: Callable[[dict], None] = lambda row: None,
               failed_row: Callable[[str, str], dict],
               stop: Callable[[], bool] = lambda: False) -> list[dict]:
    """Run every chain's studies on ``jobs`` spawned workers of ``threads`` threads each.

    ``run_one(name, *args) -> row`` runs in the worker (a module-level function, so it can be sent);
    ``on_start(name)`` / ``on_row(row)`` are called in this process as each study starts / ends;
    ``failed_row(name, error)`` makes the row of a study whose worker died. Once ``stop()`` is true
    (the disk is full: every next study would fail too) no study is started; those running finish and
    their workers end as usual. Returns the rows in the order the studies finished."""
    pool = _Pool(chains, run_one, threads, on_start, on_row, failed_row, stop)
    done = False
    try:
        pool.run(jobs)
        done = True
        return pool.rows
    finally:  # idle workers are told to stop; after an error or Ctrl-C here, busy ones are killed
        pool.close(done)
