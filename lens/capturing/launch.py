"""One capture across processes, GPUs and machines, on the launchers that already exist.

A launcher tells each process, through its environment, which of N it is; :func:`launch_context`
reads that into a :class:`LaunchContext` and :func:`capture_launched` turns it into the store's own
primitive, ``--part I/N`` and the verified merge (:mod:`lens.store.parts`):

* ``torchrun`` / ``torch.distributed`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, with ``MASTER_ADDR`` /
  ``MASTER_PORT``): rank R captures part R+1 of WORLD_SIZE on ``cuda:LOCAL_RANK`` (when CUDA is there and
  ``--device`` is not given, or given as bare ``cuda``; else on the CPU). Once every rank has finished its part
  (a ``torch.distributed`` barrier), rank 0 merges. The barrier runs on gloo whatever the device: it
  moves no tensors, needs no GPU memory and no NCCL watchdog, and it may wait as long as the slowest rank
  captures (``LENS_LAUNCH_TIMEOUT_S``, default a week, bounds it).
* Slurm job arrays (``SLURM_ARRAY_TASK_ID``, ``SLURM_ARRAY_TASK_COUNT``, ``SLURM_ARRAY_TASK_MIN``, and
  ``SLURM_ARRAY_TASK_STEP`` when there is one): task ID captures part (ID - MIN) / STEP + 1 of COUNT. No
  barrier exists between array tasks, so after its part each task takes the launch lock and merges if
  every part is complete: the last task to finish merges. A task that finds parts still missing names
  them and the ``lens store merge`` command that would join them.

Where the parts live: ``OUT.parts/part-I-of-N``, a sibling of ``--out`` (so on several machines, on a
filesystem every machine shares). Each is an ordinary part store: a rank or task killed mid-way resumes
it with the same command plus ``--resume``. The merge writes ``OUT`` (equal byte for byte to a single
capture, its manifest apart: creation time, seal and the ``merged_from`` provenance), then reads it back
whole (:func:`lens.store.verify.verify_store`); only a verified store removes ``OUT.parts``, and a
failed verification keeps the parts. The launch lock, ``OUT.launch.lock`` beside ``--out`` (an ``flock``,
dropped by the kernel when its holder dies; the file is removed on release), makes the completeness check
and the merge one step, so two tasks finishing together never both merge and never both leave it.

A rerun after the merge (``--resume``, ``OUT`` complete) captures nothing: the store's settings are
checked against the command's (by the ordinary resume check) and the run ends.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Mapping

from lens.errors import LensInputError, StoreCorruptError, StoreLockedError
from lens.store.parts import Part, parse_part
import torch
from lens.runtime.devices import parse_device
from lens.store.format import is_store, load_manifest
from lens.store.manifest import Manifest
from lens.store.lock import WriterLock
from lens.store.parts import merge_stores
from lens.store.verify import verify_store
import torch.distributed as dist
from lens.capturing.capture import capture

log = logging.getLogger(__name__)

TORCHRUN = "torchrun"
SLURM_ARRAY = "slurm-array"
TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
SLURM_VARS = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN")
TIMEOUT_ENV = "LENS_LAUNCH_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 7 * 24 * 3600
LOCK_POLL_S = 0.2


@dataclass(frozen=True)
class LaunchContext:
    """Which of the launched processes this one is. ``launcher`` is ``"torchrun"``, ``"slurm-array"``
    or ``""`` (not launched); ``part`` is this process's part, ``None`` for a single process (a launch of
    one, or none); ``local_rank`` / ``local_world_size`` are torchrun's (``None`` elsewhere)."""

    launcher: str = ""
    part: Part | None = None
    local_rank: int | None = None
    local_world_size: int | None = None
    described: str = ""  # the variables read, for messages: "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1"

    @property
    def rank(self) -> int:
        return 0 if self.part is None else self.part.index - 1

    @property
    def world_size(self) -> int:
        return 1 if self.part is None else self.part.count

    @property
    def leader(self) -> bool:
        """The process that merges under torchrun (rank 0). Slurm array tasks have none: the last merges."""
        return self.rank == 0


def _int(env: Mapping[str, str], name: str, lowest: int) -> int:
    text = env[name].strip()
    try:
        value = int(text)
    except ValueError:
        raise LensInputError(f"{name}={text!r}: expected an integer >= {lowest}") from None
    if value < lowest:
        raise LensInputError(f"{name}={value}: expected an integer >= {lowest}")
    return value


def _shown(env: Mapping[str, str], names) -> str:
    return " ".join(f"{n}={env[n]}" for n in names if n in env)


def launch_context(env: Mapping[str, str] | None = None, part=None) -> LaunchContext:
    """The launch context of this process from ``env`` (default ``os.environ``). ``part`` is the
    ``--part`` of the command line, refused when a launcher chooses the part too. Inconsistent
    environments (a partial one, RANK >= WORLD_SIZE, both launchers at once) raise ``LensInputError``."""
    env = os.environ if env is None else env
    torch_set = [n for n in TORCH_VARS if n in env]
    slurm_set = [n for n in SLURM_VARS if n in env]
    if torch_set and slurm_set:
        raise LensInputError(f"both a torchrun environment ({_shown(env, torch_set)}) and a Slurm array "
                             f"({_shown(env, slurm_set)}) choose this process's part: use one launcher (start "
                             "the array's tasks without torchrun, or unset SLURM_ARRAY_TASK_ID)")
    if torch_set:
        return _torchrun(env, torch_set, part)
    if slurm_set:
        return _slurm(env, slurm_set, part)
    return LaunchContext(part=parse_part(part))


def _refuse_part(part, described: str) -> None:
    if part is not None:
        raise LensInputError(f"--part {part} was given, but the launcher already chooses this process's part "
                             f"({described}): drop --part")


def _require_all(env, present, names, what: str, hint: str) -> None:
    """Refuse a launcher environment that sets only some of ``names`` (one line: which are missing)."""
    if len(present) < len(names):
        missing = [n for n in names if n not in env]
        raise LensInputError(f"a partial {what}: {_shown(env, present)} is set but {', '.join(missing)} "
                             f"{'is' if len(missing) == 1 else 'are'} not; expected all of {', '.join(names)} ({hint})")


def _torchrun(env, present, part) -> LaunchContext:
    _require_all(env, present, TORCH_VARS, "torchrun environment", "start the command with torchrun, or unset them")
    rank, world, local = _int(env, "RANK", 0), _int(env, "WORLD_SIZE", 1), _int(env, "LOCAL_RANK", 0)
    described = _shown(env, TORCH_VARS)
    if rank >= world:
        raise LensInputError(f"RANK={rank} with WORLD_SIZE={world}: expected 0 <= RANK < WORLD_SIZE")
    local_world = _int(env, "LOCAL_WORLD_SIZE", 1) if "LOCAL_WORLD_SIZE" in env else None
    if local_world is not None and local >= local_world:
        raise LensInputError(f"LOCAL_RANK={local} with LOCAL_WORLD_SIZE={local_world}: expected "
                             "0 <= LOCAL_RANK < LOCAL_WORLD_SIZE")
    if world > 1:
        missing = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not env.get(n)]
        if missing:
            raise LensInputError(f"{described}, but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                                 "not set: torch.distributed needs them to meet the other ranks (torchrun sets them)")
    _refuse_part(part, described)
    return LaunchContext(TORCHRUN, Part(rank + 1, world) if world > 1 else None, local, local_world, described)


def _slurm(env, present, part) -> LaunchContext:
    _require_all(env, present, SLURM_VARS, "Slurm array environment", "Slurm sets them for the tasks of `sbatch --array`")
    task, count, low = (_int(env, "SLURM_ARRAY_TASK_ID", 0), _int(env, "SLURM_ARRAY_TASK_COUNT", 1),
                        _int(env, "SLURM_ARRAY_TASK_MIN", 0))
    step = _int(env, "SLURM_ARRAY_TASK_STEP", 1) if env.get("SLURM_ARRAY_TASK_STEP") else 1
    described = _shown(env, SLURM_VARS + ("SLURM_ARRAY_TASK_STEP",))
    offset = task - low
    if offset < 0 or offset % step or offset // step >= count:
        raise LensInputError(f"{described}: task {task} is not one of {count} evenly spaced ids from {low}; "
                             f"expected an array of consecutive ids such as --array={low}-{low + count - 1}")
    _refuse_part(part, described)
    return LaunchContext(SLURM_ARRAY, Part(offset // step + 1, count) if count > 1 else None, None, None, described)


def rank_device(ctx: LaunchContext, requested: str | None) -> str:
    """The device this process captures on. ``requested`` is ``--device`` (``None`` when not given):
    not given, a launched process takes its own GPU (``cuda:LOCAL_RANK``, or ``cuda`` in a Slurm task,
    which sees its own GPUs) when CUDA is available, else the CPU; a bare ``cuda`` under torchrun is
    ``cuda:LOCAL_RANK``; anything else is taken as given. Not launched, the default is the CPU."""
    if not ctx.launcher:
        return parse_device(requested or "cpu")
    if requested is None:
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested.strip() == "cuda" and ctx.local_rank is not None:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n and ctx.local_rank >= n:
            raise LensInputError(f"LOCAL_RANK={ctx.local_rank}, but this machine shows only {n} CUDA device"
                                 f"{'s' if n != 1 else ''}: start at most {n} processes per machine "
                                 f"(--nproc-per-node {n}) or pass --device cpu")
        requested = f"cuda:{ctx.local_rank}"
    device = parse_device(requested)
    if device.startswith("cuda:"):
        torch.cuda.set_device(int(device.split(":")[1]))  # streams and caches made without a device go there
    return device


def threads_per_process(ctx: LaunchContext, cores: int) -> int | None:
    """Threads for each of the processes a launcher started on one machine (their share of ``cores``),
    or ``None`` when this process has the machine's cores to itself."""
    if ctx.local_world_size and ctx.local_world_size > 1:
        return max(1, cores // ctx.local_world_size)
    return None


# --------------------------------------------------------------------------- where the parts live
def parts_root(out) -> Path:
    """The folder of a launched capture's parts: ``OUT.parts``, beside ``OUT``."""
    out = Path(out)
    return out.with_name(out.name + ".parts")


def part_dir(out, part: Part) -> Path:
    return parts_root(out) / f"part-{part.index}-of-{part.count}"


def merge_command(out, count: int) -> str:
    parts = " ".join(str(part_dir(out, Part(i, count))) for i in range(1, count + 1))
    return f"lens store merge {parts} --out {out}"


def _manifest(root: Path) -> Manifest | None:
    """The store manifest at ``root`` (seal and schema checked), ``None`` when there is none."""
    return load_manifest(root) if is_store(root) else None


def _complete(root: Path) -> bool:
    m = _manifest(root)
    return bool(m and m.complete)


def _interrupted_merge(m: Manifest | None) -> bool:
    return bool(m and not m.complete and m.merged_from is not None)


def _check_out(out: Path) -> None:
    """Refuse an ``--out`` that holds something a launched capture did not make (its parts go beside it)."""
    if out.exists() and not out.is_dir():
        raise LensInputError(f"--out {out} exists and is not a folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
    m = _manifest(out)
    if m is None or not (m.complete or _interrupted_merge(m)):
        what = "an incomplete store" if m else "files that are not a store"
        raise LensInputError(f"--out {out} holds {what}: a launched capture writes its parts to {parts_root(out)} and "
                             "merges them into --out, which must be new or empty; choose another --out")


class _LaunchLock:
    """``OUT.launch.lock`` beside ``OUT``: held (waiting for it) while a process checks the parts and merges."""

    def __init__(self, out: Path):
        self.lock = WriterLock(out.parent)
        self.lock.path = out.parent / f"{out.name}.launch.lock"

    def __enter__(self):
        waited = False
        while True:
            try:
                self.lock.acquire()
                return self
            except StoreLockedError as exc:
                if not waited:
                    log.info("waiting for the launch lock %s (%s)", self.lock.path, exc)
                    waited = True
                time.sleep(LOCK_POLL_S)

    def __exit__(self, *exc):
        self.lock.release()


@dataclass(frozen=True)
class LaunchOutcome:
    """What a launched process did. ``wrote``: the folder it captured into (its part, or ``--out``);
    ``merged``: this process merged the parts into ``--out``; ``complete``: ``--out`` is complete now;
    ``waiting``: the parts not complete yet (labels ``i/N``), with ``next_step`` the command that joins
    them once they are."""

    wrote: Path
    merged: bool = False
    complete: bool = False
    waiting: tuple = ()
    next_step: str = ""
    n_tokens: int = 0


def merge_if_complete(out, count: int, progress: bool = False) -> LaunchOutcome:
    """Under the launch lock: merge the ``count`` parts of ``out`` if every one is complete (and no other
    process has merged them already), verify the result, remove the parts. Otherwise say which are missing."""
    out = Path(out)
    root = parts_root(out)
    with _LaunchLock(out):
        m = _manifest(out)
        if m and m.complete:
            return LaunchOutcome(out, complete=True, n_tokens=m.n_tokens)  # another process merged
        parts = [part_dir(out, Part(i, count)) for i in range(1, count + 1)]
        waiting = tuple(f"{i}/{count}" for i, p in enumerate(parts, 1) if not _complete(p))
        if waiting:
            return LaunchOutcome(root, waiting=waiting, next_step=merge_command(out, count))
        if _interrupted_merge(m):  # a merge killed mid-way: its store is only ever made from the parts, still here
            log.warning("%s: removing the store of an interrupted merge, to merge again from %s", out, root)
            shutil.rmtree(out)
        merge_stores(parts, out, progress=progress)
        report = verify_store(out)
        if not report.ok:
            raise StoreCorruptError(f"the merged store {out} fails verification ({report.problems[0]}); the parts are "
                                    f"kept in {root}: delete {out} and run `{merge_command(out, count)}`")
        shutil.rmtree(root)
        return LaunchOutcome(out, merged=True, complete=True, n_tokens=report.n_tokens)


def _init_group(ctx: LaunchContext):
    """The gloo process group the barrier runs on (``None`` if the caller already made one)."""
    if dist.is_initialized():
        return None
    seconds = float(os.environ.get(TIMEOUT_ENV, "") or DEFAULT_TIMEOUT_S)
    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=seconds))  # env://: RANK, WORLD_SIZE, MASTER_*
    except (RuntimeError, ValueError) as exc:
        raise LensInputError(f"rank {ctx.rank}: torch.distributed could not meet the other ranks ({ctx.described}): "
                             f"{' '.join(str(exc).split())[:300]}") from None
    return dist


def _barrier(ctx: LaunchContext) -> None:
    try:
        dist.barrier()
    except RuntimeError as exc:
        raise LensInputError(f"rank {ctx.rank}: another rank stopped before finishing its part ({' '.join(str(exc).split())[:200]}); "
                             "rerun the same command with --resume") from None


def rerun_problem(out, ctx: LaunchContext, resume: bool) -> str | None:
    """Why this launched process must not start on ``out`` (None: it may): ``out`` holds something a launched
    capture did not make, or it is the complete store of an earlier launch and ``--resume`` was not given — the
    same launch rerun. Asked before the model is loaded, so the refusal is one line and costs nothing; under
    torchrun the caller lets rank 0 say it and the other ranks end with the same exit status, silently."""
    out = Path(out)
    if not ctx.launcher or ctx.part is None:  # a plain capture (--part or not) is checked by the capture itself
        return None
    try:
        _check_out(out)
    except LensInputError as exc:
        return str(exc)
    m = None if resume else _manifest(out)
    if m and m.complete:
        merged = len(m.merged_from or ())
        return (f"a store already exists at {out} (complete{f', merged from {merged} parts' if merged else ''}): this "
                "launch has nothing left to capture; rerun it with --resume to check the store against this command "
                "(it captures nothing), or choose another --out")
    return None


def capture_launched(model, out, ctx: LaunchContext, *, resume: bool = False, progress: bool = True,
                     **capture_kwargs) -> LaunchOutcome:
    """Capture this process's part of a launched capture into ``OUT.parts``, and merge when the launcher's
    rule says so (torchrun: rank 0 after the barrier; Slurm array: the last task to finish). A launch of
    one process (or none) captures straight into ``out``. ``capture_kwargs`` go to :func:`lens.capturing.capture`."""
    out = Path(out)
    if ctx.part is None:
        store = capture(model, out=out, resume=resume, progress=progress, **capture_kwargs)
        return LaunchOutcome(out, complete=True, n_tokens=store.n_tokens)
    problem = rerun_problem(out, ctx, resume)
    if problem:
        raise LensInputError(problem)
    if _complete(out):  # a rerun after the merge (--resume): nothing left to capture
        if ctx.launcher == SLURM_ARRAY or ctx.leader:  # the ordinary resume check of the settings; captures nothing
            with _LaunchLock(out):
                store = capture(model, out=out, resume=True, progress=False, **capture_kwargs)
            return LaunchOutcome(out, complete=True, n_tokens=store.n_tokens)
        return LaunchOutcome(out, complete=True)
    mine = part_dir(out, ctx.part)
    if ctx.launcher == SLURM_ARRAY:
        capture(model, out=mine, part=ctx.part, resume=resume, progress=progress, **capture_kwargs)
        return _mine(merge_if_complete(out, ctx.world_size, progress=progress), mine)
    group = _init_group(ctx)
    try:
        capture(model, out=mine, part=ctx.part, resume=resume, progress=progress, **capture_kwargs)
        _barrier(ctx)
        if not ctx.leader:
            return LaunchOutcome(mine)
        done = merge_if_complete(out, ctx.world_size, progress=progress)
        if done.waiting:
            raise LensInputError(f"every rank finished its part, but rank 0 cannot see complete part(s) "
                                 f"{', '.join(done.waiting)} in {parts_root(out)}: on several machines --out must be "
                                 f"on a filesystem they all share (or copy the parts here and run `{done.next_step}`)")
        return done
    finally:
        if group is not None:
            group.destroy_process_group()


def _mine(outcome: LaunchOutcome, mine: Path) -> LaunchOutcome:
    return outcome if outcome.merged or outcome.complete else LaunchOutcome(
        mine, waiting=outcome.waiting, next_step=outcome.next_step)


__all__ = ["LaunchContext", "LaunchOutcome", "launch_context", "rank_device", "threads_per_process", "parts_root",
           "part_dir", "merge_command", "merge_if_complete", "capture_launched", "rerun_problem"]
