"""The ``lens`` command line.

Exit codes: 0 success; 2 bad input (one line on stderr, no traceback); 1 internal error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        self.exit(2, f"lens: error: {message}\n")


def _device(text: str) -> str:
    """argparse type: a device that exists here (a bad one is exit 2 with one line, not a torch assertion)."""
    from lens.runtime.devices import parse_device
    from lens.errors import LensInputError

    try:
        return parse_device(text)
    except LensInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_capture_args(p):
    p.add_argument("--corpus", default="wiki-sample", help="wiki-sample, lee, or a .txt / .jsonl file")
    p.add_argument("--max-tokens", type=int, default=20_000)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="cpu", type=_device, help="cpu or cuda")
    _add_memory_flag(p)


def _add_memory_flag(p):
    p.add_argument("--no-memory-check", action="store_true",
                   help="load a model even when its weights look larger than the memory available")


def _add_model_args(p):
    """How the model is loaded and run (not how a store keeps its arrays: that is the store's --dtype)."""
    p.add_argument("--model-dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="dtype of the model's weights and forward pass (default auto: bfloat16 on CUDA, float32 "
                        "on CPU); recorded in the store and results")
    p.add_argument("--attn", default="eager", choices=("eager", "sdpa"),
                   help="the model's attention implementation (default eager)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lens", description="Lens Workbench: layer-by-layer analysis of language models")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("models", help="list model aliases and whether each is installed")
    sub.add_parser("corpora", help="list built-in corpora")
    _add_inspect_parser(sub)
    _add_capture_parser(sub)
    _add_stats_parser(sub)
    _add_store_parser(sub)
    _add_study_parser(sub)
    _add_report_parser(sub)
    _add_app_parser(sub)
    return parser


def _add_inspect_parser(sub) -> None:
    """lens inspect MODEL"""
    ins = sub.add_parser("inspect", help="show a model's hook-site map, absent sites and family facts")
    ins.add_argument("model", help="alias, tiny:<model_type>, Hugging Face id, model folder or .gguf file")
    ins.add_argument("--json", action="store_true")
    _add_memory_flag(ins)
    _add_model_args(ins)


def _add_capture_parser(sub) -> None:
    """lens capture MODEL --out STORE"""
    cap = sub.add_parser("capture", help="capture activations into a store")
    cap.add_argument("model", help="alias, Hugging Face id, model folder or .gguf file")
    _add_capture_args(cap)
    cap.add_argument("--sites", default="resid_post", help="comma list: embed,resid_pre,resid_mid,resid_post,attn_out,mlp_out,router_logits,final_norm (lens inspect MODEL lists a model's)")
    cap.add_argument("--layers", default="all", help="all, '0,3,5' or '2-6'")
    cap.add_argument("--out", required=True, help="store folder")
    cap.add_argument("--dtype", default="float32",
                     help="the store's array dtype: float32, float16 or bfloat16 (the model's is --model-dtype)")
    _add_model_args(cap)
    cap.add_argument("--backend", default="native", help="native, transformer-lens or nnsight")
    cap.add_argument("--resume", action="store_true", help="continue an interrupted capture")
    cap.add_argument("--shard-tokens", type=int, default=16384)
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
    cap.set_defaults(device=None)  # launched: the rank's own GPU when there is one (lens.capturing.launch.rank_device)
    cap.add_argument("--positions", default="all",
                     help="keep only these positions of each window: all, last, every:K, first:K or a list such "
                          "as 0,5,-1 (studies that need every position refuse a thinned store)")
    cap.add_argument("--no-space-check", action="store_true",
                     help="capture even when the store's estimated size exceeds the free space of --out's disk")


def _add_stats_parser(sub) -> None:
    """lens stats MODEL --out FOLDER"""
    sts = sub.add_parser("stats", help="per-layer statistics reduced where the model runs (nnsight; NDIF with --remote)")
    sts.add_argument("model", help="alias, Hugging Face id (the hub id with --remote), model folder or .gguf file")
    _add_capture_args(sts)
    sts.add_argument("--sites", default="resid_post", help="comma list of sites, as for capture")
    sts.add_argument("--layers", default="all", help="all, '0,3,5' or '2-6'")
    sts.add_argument("--positions", default="all",
                     help="all, last, every:K, first:K, or positions among each window's real tokens such as 0,5,-1")
    sts.add_argument("--no-cov", action="store_true",
                     help="leave out the d x d covariance sums (then no top-PC share; far fewer bytes back)")
    sts.add_argument("--remote", action="store_true", help="run on NDIF (needs an NDIF API key)")
    sts.add_argument("--out", required=True, help="folder for stats.npz and stats.json")
    sts.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_model_args(sts)


def _add_store_parser(sub) -> None:
    """lens store info|verify|merge"""
    store = sub.add_parser("store", help="inspect, verify or merge stores")
    store_sub = store.add_subparsers(dest="store_command", required=True, parser_class=_Parser)
    info = store_sub.add_parser("info", help="describe a store and summarise each layer")
    info.add_argument("path")
    info.add_argument("--json", action="store_true")
    info.add_argument("--no-stats", action="store_true", help="skip the per-layer statistics")
    info.add_argument("--verify", action="store_true", help="also read every byte and check every checksum")
    ver = store_sub.add_parser("verify", help="read every byte of a store, check every checksum and the schema")
    ver.add_argument("path")
    ver.add_argument("--json", action="store_true")
    mrg = store_sub.add_parser("merge", help="join the parts of a capture split with --part I/N into one store")
    mrg.add_argument("parts", nargs="+", help="the part store folders (any order)")
    mrg.add_argument("--out", required=True, help="the new store folder")
    mrg.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_study_parser(sub) -> None:
    """lens study NAME --out FOLDER"""
    study = sub.add_parser("study", help="run a study (or 'all') and write a results folder")
    study.add_argument("name")
    study.add_argument("--model", default="smollm2-135m")
    _add_capture_args(study)
    study.add_argument("--store", default=None, help="reuse (or create) the store in this folder")
    _add_model_args(study)
    study.add_argument("--seed", type=int, default=0)
    study.add_argument("--out", required=True)
    study.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                       help="a study-specific config field (repeatable)")
    study.add_argument("--only", default=None, help="with 'all': comma list of studies to run")
    study.add_argument("--quiet", action="store_true")
    study.add_argument("--resume", action="store_true",
                       help="with 'all': keep the studies already finished in --out with the same settings")
    study.add_argument("--jobs", default="auto",
                       help="with 'all': worker processes for the studies, each with its share of the cores "
                            "(default auto: one per core, at most 4; 1 on a GPU; 1 = one after another)")


def _add_report_parser(sub) -> None:
    """lens report PATH"""
    rep = sub.add_parser("report", help="rebuild report.html from results folders")
    rep.add_argument("path")


def _add_app_parser(sub) -> None:
    """lens app"""
    app = sub.add_parser("app", help="start the Streamlit explorer")
    app.add_argument("--results", default="results")
    app.add_argument("--stores", default="stores")
    app.add_argument("--port", type=int, default=8501)
    app.add_argument("--host", default="127.0.0.1", help="bind address (default localhost only)")
    app.add_argument("--store-device", default="cpu", type=_device,
                     help="where the Nearest tokens page holds store layers: cpu, cuda or cuda:N")
    app.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                     help="another host name browsers reach the explorer by (a reverse proxy's; repeatable; '*' "
                          "accepts any). WebSockets naming any other host are refused (DNS rebinding)")


def _cmd_models(args):
    from lens.model.loading import list_models

    for row in list_models():
        mark = "installed" if row["installed"] else f"missing ({row['package']})"
        print(f"{row['alias']:<14} {mark:<12} {row['description']}")


def _cmd_corpora(args):
    from lens.text.corpora import list_corpora

    for row in list_corpora():
        mark = "available" if row["available"] else "missing"
        print(f"{row['name']:<12} {mark:<10} {row['description']}")


def _cmd_inspect(args):
    import lens
    from lens.model.describe import describe, format_description

    d = describe(lens.load_model(args.model, dtype=args.model_dtype, attn_implementation=args.attn))
    print(json.dumps(d, indent=1) if args.json else format_description(d))


def _show_capture_size() -> None:
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
    import lens
    from lens.capturing.launch import launch_context, rank_device, threads_per_process

    _show_capture_size()
    t0 = time.time()
    ctx = launch_context(part=args.part)  # torchrun / Slurm array environment, checked
    share = None if os.environ.get("LENS_NUM_THREADS") else threads_per_process(ctx, _cores())
    if share:  # several processes on this machine: each its share of the cores
        from lens.runtime.threads import configure_threads

        configure_threads(share, force=True)
    device = None if args.device_map is not None else rank_device(ctx, args.device)
    if args.device_map is None:
        model = lens.load_model(args.model, device=device, max_memory=args.max_memory,
                                offload_folder=args.offload_folder, dtype=args.model_dtype,
                                attn_implementation=args.attn)
    else:
        model = lens.load_model(args.model, device_map=_device_map(args.device_map), max_memory=args.max_memory,
                                offload_folder=args.offload_folder, dtype=args.model_dtype,
                                attn_implementation=args.attn)
    kw = dict(corpus=args.corpus, sites=[s for s in args.sites.split(",") if s], layers=args.layers,
              max_tokens=args.max_tokens, seq_len=args.seq_len, batch_size=args.batch_size, dtype=args.dtype,
              backend=args.backend, shard_tokens=args.shard_tokens, remote=args.remote, positions=args.positions,
              check_space=not args.no_space_check)
    if ctx.launcher and ctx.part is not None:  # (a launch of one is a plain capture on the rank's device)
        _capture_launched(args, model, ctx, kw, t0)
        return
    store = lens.capture(model, out=args.out, resume=args.resume, progress=not args.quiet, part=args.part, **kw)
    part = f" (part {args.part})" if args.part else ""
    print(f"captured {store.n_tokens} tokens of {store.model_id} into {args.out}{part} "
          f"({len(store.manifest['shards'])} shards, {time.time() - t0:.1f} s)")


def _cores() -> int:
    from lens.runtime.threads import available_cores

    return available_cores()


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
        print(f"{args.out} is complete ({ctx.world_size} parts, merged): nothing left to capture ({who}, {took})")
    else:
        print(f"captured {who} into {done.wrote} ({took}); rank 0 merges")


def _cmd_stats(args):
    import lens
    from geometry import anisotropy_from_stats
    from lens.capturing.capture import library_versions
    from lens.capturing.collect import collect_stats
    from lens.store.layer_stats import STATS_FILE, save_stats
    from lens.model.loading import attn_implementation, model_dtype_name

    t0 = time.time()
    model = lens.load_model(args.model, device=args.device, dtype=args.model_dtype, attn_implementation=args.attn)
    run = collect_stats(model, corpus=args.corpus, sites=[s for s in args.sites.split(",") if s], layers=args.layers,
                        positions=args.positions, cov=not args.no_cov, remote=args.remote,
                        max_tokens=args.max_tokens, seq_len=args.seq_len, batch_size=args.batch_size,
                        progress=not args.quiet)
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
    record = {"model": run.model_id, "corpus": run.corpus, "remote": args.remote,
              "model_dtype": model_dtype_name(model), "attn": attn_implementation(model),
              "positions": run.positions if isinstance(run.positions, str) else list(run.positions),
              "cov": not args.no_cov, "n_tokens": next(iter(run.stats.values())).n, "n_requests": run.n_requests,
              "bytes_back": run.bytes_back, "bytes_estimated": run.bytes_estimated, "arrays": STATS_FILE,
              "sites": per_site, "library_versions": library_versions()}
    (out / "stats.json").write_text(json.dumps(_nan_to_null(record), indent=1, allow_nan=False))
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
    from lens.errors import LensInputError

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LensInputError(f"--device-map is not a valid JSON object ({exc.msg}): expected auto, balanced, "
                             "sequential or {\"module\": \"device\", ...}") from None
    return value


def _cmd_store_info(args):
    import lens

    store = lens.open_store(args.path)
    m = store.manifest
    rows = [] if args.no_stats else store.summary()
    report = _verify(args.path) if args.verify else None
    counts = _nonfinite_counts(store, rows, report)
    lies = _nonfinite_lies(store, counts) if rows and report is None else []  # --verify reports them itself
    if args.json:
        print(json.dumps({"manifest": {k: v for k, v in m.items() if k != "shards"},
                          "n_shards": len(m["shards"]), "layers": rows,
                          "nonfinite": {s: {str(l): c for l, c in v.items()} for s, v in counts.items()},
                          "nonfinite_mismatch": lies,
                          **({"verify": _report_dict(report)} if report else {})}, indent=1))
        return _verdict(report) or _refuse_lies(args.path, lies)
    print(f"store      {args.path}")
    print(f"model      {m['model']['model_id']} ({m['model'].get('revision', '')})")
    print(f"corpus     {m['corpus']['name']}  transform={m['corpus'].get('transform')}")
    print(f"tokens     {m['n_tokens']} of {m.get('n_tokens_planned')} planned, {len(m['shards'])} shards, "
          f"{'complete' if m.get('complete') else 'INCOMPLETE (resume with --resume)'}")
    print(f"dtype      {m['dtype']} (stored)   model {m.get('settings', {}).get('model_dtype', m['model'].get('dtype'))}   "
          f"d_model {m['d_model']}   format {m['format_version']}")
    for site, layers in m["sites"].items():
        print(f"site       {site}: layers {layers if layers != [None] else '-'}")
    for line in _nonfinite_lines(counts):
        print(f"NON-FINITE {line}")
    for line in lies:
        print(f"PROBLEM    {line}")
    if rows:
        print(f"{'site':<12}{'layer':>6}{'mean |h|':>12}{'mean':>10}{'max |x|':>11}{'non-finite':>12}")
        for r in rows:
            layer = "-" if r["layer"] is None else r["layer"]
            flag = f"{r['nonfinite']:>12}" if r["nonfinite"] else f"{'0':>12}"
            print(f"{r['site']:<12}{layer:>6}{r['mean_norm']:>12.3f}{r['mean']:>10.4f}{r['max_abs']:>11.2f}{flag}")
    if report:
        _print_report(report)
    return _verdict(report) or _refuse_lies(args.path, lies)


def _nonfinite_counts(store, rows, report) -> dict:
    """site -> {layer: NaN/inf count}, non-zero only: counted in the data by the statistics or by
    --verify when either ran, else as the manifest records them."""
    counts: dict = {}
    if rows:
        for r in rows:
            if r["nonfinite"]:
                counts.setdefault(r["site"], {})[r["layer"]] = r["nonfinite"]
    elif report is not None:
        counts = {s: dict(v) for s, v in report.nonfinite.items()}
    else:
        for site in store.sites:
            for layer, c in (store.nonfinite(site) or {}).items():
                if c:
                    counts.setdefault(site, {})[layer] = c
    return counts


def _nonfinite_lies(store, counted: dict) -> list[str]:
    """Where the data holds other NaN/inf counts than the manifest records (a store re-sealed after its
    capture): one line per site and layer."""
    out = []
    for site in store.sites:
        recorded = store.nonfinite(site)
        if recorded is None:  # format 1: nothing recorded
            continue
        for layer, want in recorded.items():
            got = counted.get(site, {}).get(layer, 0)
            if got != want:
                at = site if layer is None else f"{site} layer {layer}"
                out.append(f"{at}: the data holds {got} non-finite values (NaN or inf), the manifest records {want} — the store was "
                           "altered after its capture; studies refuse it")
    return out


def _refuse_lies(path, lies: list) -> None:
    if lies:
        from lens.errors import StoreCorruptError

        more = f" (and {len(lies) - 1} more, listed above)" if len(lies) > 1 else ""
        raise StoreCorruptError(f"store {path}: {lies[0]}{more}")


def _nonfinite_lines(counts: dict) -> list[str]:
    """One line per site with non-finite values."""
    out = []
    for site, by_layer in counts.items():
        where = "" if list(by_layer) == [None] else f" layers {', '.join(map(str, by_layer))}"
        out.append(f"{site}{where}: {sum(by_layer.values())} NaN/inf values — studies refuse these layers")
    return out


def _verify(path):
    from lens.store.verify import verify_store

    return verify_store(path)


def _report_dict(report) -> dict:
    import dataclasses

    d = dataclasses.asdict(report)
    d["nonfinite"] = {s: {str(l): c for l, c in v.items()} for s, v in report.nonfinite.items()}
    return {**d, "ok": report.ok}


def _print_report(report) -> None:
    print(f"verify     {report.path}: format {report.format_version}, {report.n_shards} shards, "
          f"{report.n_tokens} tokens, {report.n_files} files, {report.n_bytes / 1e6:.1f} MB read"
          f"{'' if report.complete else ' (incomplete store)'}")
    for w in report.warnings:
        print(f"WARNING    {w}")
    for site, by_layer in report.nonfinite.items():
        print(f"NON-FINITE {site}: " + ", ".join(f"{'-' if l is None else f'layer {l}'}: {c}" for l, c in by_layer.items()))
    for p in report.problems:
        print(f"PROBLEM    {p}")
    print("verify     OK: every checksum and the schema hold" if report.ok
          else f"verify     FAILED: {len(report.problems)} problems")


def _verdict(report) -> int | None:
    if report is None or report.ok:
        return None
    from lens.errors import StoreCorruptError

    more = f" (and {len(report.problems) - 1} more, listed above)" if len(report.problems) > 1 else ""
    raise StoreCorruptError(f"store {report.path} failed verification: {report.problems[0]}{more}")


def _cmd_store_verify(args):
    report = _verify(args.path)
    if args.json:
        print(json.dumps(_report_dict(report), indent=1))
    else:
        _print_report(report)
    return _verdict(report)


def _cmd_store_merge(args):
    import lens
    from lens.store.parts import merge_stores

    t0 = time.time()
    out = merge_stores(args.parts, args.out, progress=not args.quiet)
    store = lens.open_store(out)
    print(f"merged {len(args.parts)} parts into {out}: {store.n_tokens} tokens of {store.model_id}, "
          f"{len(store.manifest['shards'])} shards ({time.time() - t0:.1f} s)")


def _cmd_study(args) -> int | None:
    from lens.errors import LensInputError
    from studies.config import config_from_dict
    from studies.registry import get_study
    from studies.runner import run_study

    _show_capture_size()
    params = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep:
            from lens.errors import LensInputError

            raise LensInputError(f"--param expects KEY=VALUE, got {item!r}")
        params[key] = value
    base = {"model": args.model, "corpus": args.corpus, "max_tokens": args.max_tokens, "seq_len": args.seq_len,
            "batch_size": args.batch_size, "device": args.device, "store": args.store, "seed": args.seed,
            "progress": not args.quiet, "model_dtype": args.model_dtype, "attn": args.attn}
    if args.name == "all":
        from studies.job_rows import Status
        from studies.main_job import StudiesFailed, run_all

        t0 = time.time()
        try:
            rows = run_all(base, args.out, only=args.only, params=params, progress=not args.quiet,
                           resume=args.resume, jobs=args.jobs)
        except StudiesFailed as exc:
            rows = exc.rows
        for row in rows:
            print(f"{row.study:<18} {row.status:<7} {row.seconds or 0:7.1f} s  {row.line}")
        failed = [r.study for r in rows if r.status == Status.FAILED]
        print(f"report: {Path(args.out) / 'report.html'}  ({time.time() - t0:.0f} s in all)")
        if failed:
            print(f"lens: {len(failed)} of {len(rows)} studies failed: {', '.join(failed)} "
                  f"(details in {Path(args.out) / 'main_job.json'})", file=sys.stderr)
            return 1
        return 0
    if args.resume:
        raise LensInputError("--resume keeps the finished studies of `lens study all`; a single study has "
                             f"nothing to keep (got study {args.name!r})")
    study = get_study(args.name)
    config = config_from_dict(study.config, {**base, **params})
    t0 = time.time()
    out = run_study(study, config, args.out)
    print(f"{args.name}: wrote {out} ({time.time() - t0:.1f} s)")


def _cmd_report(args):
    from studies.report import build_report

    print(f"wrote {build_report(args.path)}")


def _cmd_app(args):
    from app.launch import launch

    return launch(results=args.results, stores=args.stores, port=args.port, host=args.host,
                  store_device=args.store_device, allow_hosts=args.allow_host)


COMMANDS = {"models": _cmd_models, "corpora": _cmd_corpora, "inspect": _cmd_inspect, "capture": _cmd_capture, "stats": _cmd_stats,
            "study": _cmd_study,
            "report": _cmd_report, "app": _cmd_app}


# what an OSError's errno means for the user, and what to do about it
_OS_ERRORS = {
    "ENOSPC": ("the disk is full", "free some space or choose another folder, then rerun"),
    "EDQUOT": ("the disk quota is used up", "free some space or choose another folder, then rerun"),
    "EROFS": ("the filesystem is read-only", "choose a writable folder"),
    "EACCES": ("permission denied", "fix its permissions or choose another path"),
    "EPERM": ("operation not permitted", "fix its permissions or choose another path"),
    "EEXIST": ("it already exists", "remove it or choose another path"),
    "ENAMETOOLONG": ("the name is longer than the filesystem allows", "choose a shorter path or name"),
    "ENOTDIR": ("a part of the path is a file, not a folder", "fix the path"),
    "EISDIR": ("it is a folder where a file was expected", "fix the path"),
    "ENOENT": ("it does not exist", "check the path"),
    "ELOOP": ("it is a symbolic link where none is allowed (or a loop of links)",
              "replace the link by the file or folder itself"),
    "EIO": ("an input/output error (a failing disk or network filesystem)", "check the disk, then rerun"),
    "EFBIG": ("the file is larger than the filesystem allows", "choose another filesystem"),
    "EMFILE": ("too many open files", "raise the open-file limit (ulimit -n), then rerun"),
    "ENFILE": ("too many open files on this machine", "close some programs, then rerun"),
    "ENXIO": ("it is a device or pipe that cannot be used here", "use a regular file"),
}
# errnos of writing: after them a `lens study all` keeps what it finished (--resume goes on)
_WRITE_ERRNOS = ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "EIO", "EFBIG")


def _short_path(path) -> str:
    """A path for a one-line message: a name too long for the filesystem is shown by its two ends."""
    text = os.fsdecode(path) if isinstance(path, (bytes, os.PathLike)) else str(path)
    return text if len(text) <= 160 else f"{text[:80]}…{text[-60:]} ({len(text)} characters)"


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _describe_os_error(exc: OSError, args) -> str:
    """One line for an OSError: the path, what is wrong with it, what to do."""
    import errno as errno_mod

    name = errno_mod.errorcode.get(exc.errno or -1)
    if name is None:  # a library's OSError without an errno (transformers: "Can't load the configuration ...")
        what = getattr(args, "model", None)
        return _one_line(f"{what}: {exc}" if what and str(what) not in str(exc) else str(exc))
    why, todo = _OS_ERRORS.get(name, (exc.strerror or name, "fix that, then rerun"))
    where = _short_path(exc.filename) if exc.filename is not None else None
    if exc.filename2 is not None:
        where = f"{where} -> {_short_path(exc.filename2)}"
    if getattr(args, "command", None) == "study" and getattr(args, "name", None) == "all" and name in _WRITE_ERRNOS:
        todo += "; with --resume the studies already finished are kept"
    head = f"{where}: {why}" if where else why
    return _one_line(f"{head} ({exc.strerror or name}); {todo}")


def _raised_in(exc: BaseException, path_part: str, functions=()) -> bool:
    """Whether a frame of ``exc``'s traceback runs code from a file whose path has ``path_part`` (and,
    when given, one of ``functions``)."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if path_part in code.co_filename.replace(os.sep, "/") and (not functions or code.co_name in functions):
            return True
        tb = tb.tb_next
    return False


def _bad_environment(exc: BaseException, args) -> str | None:
    """The one line for an exception that comes from the user's files or machine rather than from a bug
    (a full disk, a damaged model file, a tokenizer that does not load, JSON nested past reason), or
    None for an internal error."""
    import pickle

    model = getattr(args, "model", None)
    of = f" of {model}" if model else ""
    if isinstance(exc, OSError):
        return _describe_os_error(exc, args)
    if isinstance(exc, pickle.UnpicklingError):  # torch.load(weights_only=True) refused a pickle: good
        return (f"the weights{of} are a pickled checkpoint that cannot be loaded safely (lens never runs "
                "pickled code): convert it to model.safetensors, or use the model's safetensors files")
    if type(exc).__name__ == "SafetensorError":
        return _one_line(f"a safetensors file{of} is damaged or not a safetensors file ({exc}): replace the "
                         "model's files (download them again)")
    if isinstance(exc, RecursionError):
        inputs = [f"{k} {getattr(args, a)}" for k, a in (("model", "model"), ("corpus", "corpus"))
                  if getattr(args, a, None)]
        return (f"an input is nested too deeply to read (RecursionError){' — check ' + ', '.join(inputs) if inputs else ''}: "
                "a JSON value nested thousands of levels deep is not a corpus text, config or tokenizer")
    if _raised_in(exc, "/tokeniz", ("from_pretrained", "_from_pretrained", "from_file", "from_str")):
        return _one_line(f"the tokenizer{of} cannot be loaded ({type(exc).__name__}: {exc}): its tokenizer files "
                         "(tokenizer.json, tokenizer_config.json) are damaged or not a tokenizer; replace them")
    return None


def main(argv=None) -> int:
    from lens.errors import LensInputError

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if getattr(args, "no_memory_check", False):  # read by lens.load_model here and in study workers
        os.environ["LENS_NO_MEMORY_CHECK"] = "1"
    if args.command in ("capture", "stats", "study"):  # heavy work: size every thread pool once, from the cores we have
        from lens.runtime.threads import configure_threads

        configure_threads()
    try:
        if args.command == "store":
            rc = {"verify": _cmd_store_verify, "merge": _cmd_store_merge}.get(args.store_command,
                                                                               _cmd_store_info)(args)
        else:
            rc = COMMANDS[args.command](args)
        if isinstance(rc, int):
            return rc
    except LensInputError as exc:
        return _refuse(" ".join(str(exc).splitlines()))
    except KeyboardInterrupt:
        print("lens: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one boundary: bad files / machine (exit 2) or a bug (exit 1)
        try:
            line = _bad_environment(exc, args)
        except Exception:  # noqa: BLE001 - describing must never hide the error itself
            line = None
        if line is not None:
            return _refuse(line)
        print(f"lens: internal error: {type(exc).__name__}: {_one_line(exc, 1000)}", file=sys.stderr)
        if os.environ.get("LENS_DEBUG"):
            traceback.print_exc()
        return 1
    return 0


def _refuse(line: str) -> int:
    """Bad input or a bad environment: one line on stderr, exit 2 (LENS_DEBUG=1 adds the traceback)."""
    print("lens: error: " + line, file=sys.stderr)
    if os.environ.get("LENS_DEBUG"):
        traceback.print_exc()
    return 2


if __name__ == "__main__":
    sys.exit(main())
