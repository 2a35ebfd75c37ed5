"""``lens capture`` (a store of activations; its parts under torchrun or a Slurm array) and ``lens stats``
(per-layer sums reduced where the model runs)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from app.commands.flags import (add_capture_args, add_model_args, add_setting_flags, capture_defaults,
                                load_model_from_args, settings_from_args)
import lens
from lens.capturing.settings import ModelSettings, StoreSettings, TextSettings
from lens.capturing.spec import CaptureSpec
from lens.errors import LensInputError
from lens.runtime.atomic import write_text_atomic
from lens.runtime.threads import available_cores, configure_threads


def add_parsers(sub) -> None:
    _add_capture(sub)
    _add_stats(sub)


def _add_capture(sub) -> None:
    spec = capture_defaults()
    cap = sub.add_parser("capture", help="capture activations into a store")
    cap.add_argument("model", help="alias, Hugging Face id, model folder or .gguf file")
    add_capture_args(cap)
    add_setting_flags(cap, StoreSettings, ("sites", "layers"))
    cap.add_argument("--out", required=True, help="store folder")
    add_setting_flags(cap, StoreSettings, ("dtype",))
    add_model_args(cap)
    cap.add_argument("--backend", default=spec.backend, help="native, transformer-lens or nnsight")
    cap.add_argument("--resume", action="store_true", help="continue an interrupted capture")
    add_setting_flags(cap, StoreSettings, ("shard_tokens",))
    cap.add_argument("--remote", action="store_true", help="nnsight backend: run on NDIF")
    cap.add_argument("--quiet", action="store_true", help="no progress bar")
    cap.add_argument("--device-map", default=None,
                     help="split a model too large for one device with accelerate: auto, balanced, sequential or a "
                          "JSON object {module: device} (replaces --device)")
    cap.add_argument("--max-memory", default=None, metavar="DEV=SIZE,...",
                     help="with --device-map: the memory each device may hold, e.g. 0=70GiB,1=70GiB,cpu=200GiB")
    cap.add_argument("--offload-folder", default=None, help="with --device-map: where weights offloaded to disk go")
    cap.add_argument("--part", default=None, metavar="I/N",
                     help="capture only part I of N (disjoint runs of whole shards of the same plan); "
                          "join the N parts with `lens store merge`. Under torchrun or a Slurm array the "
                          "launcher chooses the part (parts in OUT.parts, merged into OUT when all are done)")
    cap.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                     help="start N processes on this machine with torchrun (--standalone), each capturing a part, "
                          "rank 0 merging them into --out; a rerun onto the finished store is refused here in one "
                          "line (exit 2), before torchrun starts")
    cap.set_defaults(device=None)  # launched: the rank's own GPU when there is one (lens.capturing.launch.rank_device)
    add_setting_flags(cap, StoreSettings, ("positions",))
    add_setting_flags(cap, TextSettings, ("transform",))
    cap.add_argument("--no-space-check", action="store_true",
                     help="capture even when the store's estimated size exceeds the free space of --out's disk")
    cap.add_argument("--allow-silently-wrong", action="store_true",
                     help="keep the store even when the capture's fidelity check finds its states differ from the "
                          "plain Hugging Face forward past the tolerance (exit 2 otherwise); the store's record "
                          "says so, and lens store info shows it")


def _add_stats(sub) -> None:
    sts = sub.add_parser("stats", help="per-layer statistics reduced where the model runs (nnsight; NDIF with --remote)")
    sts.add_argument("model", help="alias, Hugging Face id (the hub id with --remote), model folder or .gguf file")
    add_capture_args(sts)
    add_setting_flags(sts, StoreSettings, ("sites", "layers", "positions"), help={
        "positions": "all, last, every:K, first:K, or positions among each window's real tokens such as 0,5,-1"})
    sts.add_argument("--no-cov", action="store_true",
                     help="leave out the d x d covariance sums (then no top-PC share; far fewer bytes back)")
    sts.add_argument("--remote", action="store_true", help="run on NDIF (needs an NDIF API key)")
    sts.add_argument("--out", required=True, help="folder for stats.npz and stats.json")
    sts.add_argument("--quiet", action="store_true", help="no progress bar")
    add_model_args(sts)


def show_capture_size() -> None:
    """The capture's size line (logged by lens.capturing.capture before it starts) on stdout, even without -v: it
    reports work, like the line that ends a capture; stderr keeps one line per error."""
    class ToStdout(logging.Handler):  # whatever sys.stdout is when the line comes (main() may run many times)
        def emit(self, record):
            print(record.getMessage(), file=sys.stdout, flush=True)

    size_log = logging.getLogger("lens.capturing.capture.size")
    size_log.handlers = [ToStdout()]
    size_log.setLevel(logging.INFO)
    size_log.propagate = False


def _cmd_capture(args):
    from lens.capturing.launch import TORCHRUN, launch_context, rank_device, rerun_problem, threads_per_process

    if args.nproc_per_node is not None:
        return _start_torchrun(args)
    show_capture_size()
    t0 = time.time()
    ctx = launch_context(part=args.part)  # torchrun / Slurm array environment, checked
    problem = rerun_problem(args.out, ctx, args.resume)  # the same launch rerun onto its finished store: refused now
    if problem:
        if ctx.launcher == TORCHRUN and not ctx.leader:
            return 2  # rank 0 says it, once for the launch; every rank ends with its exit status

        raise LensInputError(problem)
    share = None if os.environ.get("LENS_NUM_THREADS") else threads_per_process(ctx, _cores())
    if share:  # several processes on this machine: each its share of the cores

        configure_threads(share, force=True)
    device = None if args.device_map is not None else rank_device(ctx, args.device)
    if args.device_map is None:
        model = load_model_from_args(args, device, max_memory=args.max_memory, offload_folder=args.offload_folder)
    else:
        model = lens.load_model(args.model, device_map=_device_map(args.device_map), max_memory=args.max_memory,
                                offload_folder=args.offload_folder, dtype=args.model_dtype,
                                attn_implementation=args.attn)

    # the parts the flags name (the model is loaded above: the spec's device None keeps it where it is)
    kw = {"spec": CaptureSpec.of(settings_from_args(ModelSettings, args),
                                 settings_from_args(TextSettings, args), settings_from_args(StoreSettings, args),
                                 device=None, backend=args.backend, remote=args.remote,
                                 check_space=not args.no_space_check),
          "allow_silently_wrong": args.allow_silently_wrong}
    if ctx.launcher and ctx.part is not None:  # (a launch of one is a plain capture on the rank's device)
        _capture_launched(args, model, ctx, kw, t0)
        return
    store = lens.capture(model, out=args.out, resume=args.resume, progress=not args.quiet, part=args.part, **kw)
    part = f" (part {args.part})" if args.part else ""
    print(f"captured {store.n_tokens} tokens of {store.model_id} into {args.out}{part} "
          f"({len(store.manifest.shards)} shards, {time.time() - t0:.1f} s)")


def _cores() -> int:
    return available_cores()


def _without_nproc(argv: list) -> list:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc-per-node":
            skip = True
        elif not a.startswith("--nproc-per-node="):
            out.append(a)
    return out


def _start_torchrun(args) -> int:
    """``lens capture ... --nproc-per-node N``: what would make the launch fail is refused here, in one line with
    exit 2, before torchrun starts (torchrun ends any failed launch in its own banner and exit 1); then
    ``python -m torch.distributed.run --standalone --nproc-per-node N -m lens capture ...`` (the same arguments
    without this one) runs to its end and its exit status is this command's."""
    from lens.capturing.launch import TORCHRUN, LaunchContext, launch_context, rerun_problem
    from lens.store.parts import Part

    n = args.nproc_per_node
    if n < 1:
        raise LensInputError(f"--nproc-per-node {n}: expected at least 1 process")
    if launch_context().launcher:
        raise LensInputError("--nproc-per-node starts torchrun itself: run it without torchrun or a Slurm array "
                             "around it (or drop --nproc-per-node and let the launcher start the processes)")
    if args.part is not None:
        raise LensInputError(f"--part {args.part} with --nproc-per-node {n}: torchrun's ranks choose the parts; "
                             "drop --part")
    if n > 1:
        ctx = LaunchContext(TORCHRUN, Part(1, n), 0, n, f"--nproc-per-node {n}")
        problem = rerun_problem(args.out, ctx, args.resume)
        if problem:
            raise LensInputError(problem)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), "-m", "lens",
           *_without_nproc(args.argv)]
    return subprocess.call(cmd)


def _capture_launched(args, model, ctx, kw, t0):
    """torchrun / Slurm array: this process's part, and the merge when the launcher's rule says so."""
    from lens.capturing.launch import capture_launched

    who = f"{ctx.launcher} part {ctx.part.label}" if ctx.part else ctx.launcher
    # under torchrun one progress bar (rank 0's) stands for all; a Slurm task has its own log
    done = capture_launched(model, args.out, ctx, resume=args.resume,
                            progress=not args.quiet and (ctx.leader or ctx.launcher != "torchrun"), **kw)
    took = f"{time.time() - t0:.1f} s"
    if done.merged:
        print(f"captured {done.n_tokens} tokens of {model.model_id} into {args.out}: {ctx.world_size} parts merged "
              f"and verified by {who} ({took})")
    elif done.waiting:
        print(f"captured {who} into {done.wrote} ({took}); waiting for part{'s' if len(done.waiting) > 1 else ''} "
              f"{', '.join(done.waiting)}: the last task to finish merges, or once all are complete run: "
              f"{done.next_step}")
    elif done.complete:
        if ctx.launcher == "torchrun" and not ctx.leader:
            return  # rank 0 checked the store against the command and says it, once for the launch
        print(f"{args.out} is complete ({ctx.world_size} parts, merged): nothing left to capture ({who}, {took})")
    else:
        print(f"captured {who} into {done.wrote} ({took}); rank 0 merges")


def _cmd_stats(args):
    from geometry import anisotropy_from_stats
    from lens.capturing.capture import library_versions
    from lens.capturing.collect import collect_stats
    from lens.store.layer_stats import STATS_FILE, save_stats
    from lens.model.loading import attn_implementation, model_dtype_name

    from studies.reporting.results import require_results_folder

    t0 = time.time()
    require_results_folder(args.out)  # a store's folder, a file on the way, a read-only place: said before the work
    model = load_model_from_args(args, args.device)
    run = collect_stats(model, corpus=args.corpus, sites=[s for s in args.sites.split(",") if s], layers=args.layers,
                        positions=args.positions, cov=not args.no_cov, remote=args.remote,
                        max_tokens=args.max_tokens, seq_len=args.seq_len, batch_size=args.batch_size,
                        sample=args.sample, sample_seed=args.sample_seed, progress=not args.quiet)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_stats(run.stats, out / STATS_FILE)
    per_site = {}
    for site, st in run.stats.items():
        prof = anisotropy_from_stats(st)
        per_site[site] = {"layers": st.layers.tolist(), "mean_sq_norm": st.mean_sq_norm.tolist(),
                          "mean_cosine": prof.mean_cosine.tolist(),
                          "top_pc_share": None if args.no_cov else prof.top_pc_share.tolist(),
                          "rogue_dims": prof.rogue_dims.tolist(), "rogue_share": prof.rogue_share.tolist()}
    record = {"model": run.model_id, "corpus": run.corpus, "remote": args.remote, "sample": args.sample,
              **({"sample_seed": args.sample_seed} if args.sample != "first" else {}),
              "model_dtype": model_dtype_name(model), "attn": attn_implementation(model),
              "positions": run.positions if isinstance(run.positions, str) else list(run.positions),
              "cov": not args.no_cov, "n_tokens": next(iter(run.stats.values())).n, "n_requests": run.n_requests,
              "bytes_back": run.bytes_back, "bytes_estimated": run.bytes_estimated, "arrays": STATS_FILE,
              "sites": per_site, "library_versions": library_versions()}
    # the arrays first, the record last and whole (a reader finds the old pair or the new record)
    write_text_atomic(out / "stats.json", json.dumps(_nan_to_null(record), indent=1, allow_nan=False))
    print(f"stats of {record['n_tokens']} tokens of {run.model_id} ({len(run.stats)} sites) into {out}: "
          f"{run.bytes_back / 2**20:.1f} MB back in {run.n_requests} requests ({time.time() - t0:.1f} s)")


def _nan_to_null(value):
    """JSON has no NaN: a missing value is null (as in result.json)."""
    if isinstance(value, dict):
        return {k: _nan_to_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_null(v) for v in value]
    return None if isinstance(value, float) and value != value else value


def _device_map(text: str):
    """--device-map: a name accelerate knows, or a JSON object {module: device}."""
    if not text.lstrip().startswith("{"):
        return text

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LensInputError(f"--device-map is not a valid JSON object ({exc.msg}): expected auto, balanced, "
                             "sequential or {\"module\": \"device\", ...}") from None
    return value


COMMANDS = {"capture": _cmd_capture, "stats": _cmd_stats}
