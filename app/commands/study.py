"""``lens study`` (one study, or ``all`` of them on one shared store and a report) and ``lens report``."""

from __future__ import annotations

import shlex
import shutil
import sys
import textwrap
import time
from pathlib import Path

from app.commands.capture import show_capture_size
from app.commands.flags import add_capture_args, add_model_args, add_setting_flags, settings_from_args
from lens.capturing.settings import ModelSettings, TextSettings
from lens.errors import LensInputError
from studies.core.config import StudyConfig, config_from_dict
from studies.core.precision import RENAMED, parse_targets, target_params
from studies.core.registry import STUDIES, get_study


def add_parsers(sub) -> None:
    study = sub.add_parser("study", help="run a study (or 'all') and write a results folder", epilog=_studies_epilog())
    study.add_argument("name", metavar="STUDY", choices=(*_study_names(), "all"),
                       help="a study listed below, or 'all': every study on one shared store, and a report")
    add_setting_flags(study, ModelSettings, ("name",))
    add_capture_args(study)
    study.add_argument("--store", default=None, help="reuse (or create) the store in this folder")
    add_model_args(study)
    study.add_argument("--seed", type=int, default=0, help="seed of every random choice (samples, controls, probes)")
    study.add_argument("--out", required=True,
                       help="results folder (with 'all': one folder per study, the shared store, report.html)")
    study.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                       help="a study-specific config field (repeatable)")
    study.add_argument("--precision", action="append", default=[], metavar="[STUDY=]HALF_WIDTH",
                       help="the half-width of the headline's 95%% interval to reach, in its units (at most the "
                            "study's declared precision; its sample grows to match); with 'all': STUDY=HALF_WIDTH, "
                            "repeatable (docs/sample_sizes.md)")
    study.add_argument("--only", default=None, help="with 'all': comma list of studies to run")
    study.add_argument("--quiet", action="store_true", help="no progress bars")
    study.add_argument("--resume", action="store_true",
                       help="with 'all': keep the studies already finished in --out with the same settings")
    study.add_argument("--jobs", default="auto",
                       help="with 'all': worker processes for the studies, each with its share of the cores "
                            "(default auto: one per core, at most 4; 1 on a GPU; 1 = one after another)")

    rep = sub.add_parser("report", help="rebuild report.html from results folders")
    rep.add_argument("path", help="a folder of results (lens study ... --out); the report is written into it")


def _study_names() -> tuple[str, ...]:
    return tuple(STUDIES)


def _studies_epilog() -> str:
    """One line per registered study (wrapped to the terminal like the rest of --help), then 'all'."""
    rows = [(name, desc) for name, (_, desc) in STUDIES.items()]
    rows.append(("all", "every study above on one shared store (--only picks some), then report.html"))
    width = max(len(name) for name, _ in rows)
    cols = max(60, shutil.get_terminal_size().columns - 2)  # what argparse wraps to
    return "studies:\n" + "\n".join(
        textwrap.fill(desc, cols, initial_indent=f"  {name:<{width}}  ", subsequent_indent=" " * (width + 4))
        for name, desc in rows)


def _cmd_study(args) -> int | None:
    from studies.core.runner import run_study

    show_capture_size()
    params = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep:
            raise LensInputError(f"--param expects KEY=VALUE, got {item!r}")
        params[key] = value
    # the settings' parts the flags name (the model: name, dtype, attention, device; the text), then the run's own
    base = {"model_settings": settings_from_args(ModelSettings, args), "text": settings_from_args(TextSettings, args),
            "store": args.store, "seed": args.seed, "progress": not args.quiet}
    if args.name == "all":
        from studies.job.main_job import FAILED, StudiesFailed, run_all, select_studies
        from studies.reporting.results import machine_line

        targets = parse_targets(args.precision, select_studies(args.only))
        t0 = time.time()
        try:
            rows = run_all(config_from_dict(StudyConfig, base), args.out, only=args.only, params=params,
                           progress=not args.quiet, resume=args.resume, jobs=args.jobs, targets=targets)
        except StudiesFailed as exc:
            rows = exc.rows
        for row in rows:
            print(f"{row['study']:<18} {row['status']:<7} {row['seconds'] or 0:7.1f} s  {row['line']}")
        failed = [r["study"] for r in rows if r["status"] == FAILED]
        print(f"report: {Path(args.out) / 'report.html'}  ({time.time() - t0:.0f} s in all on {machine_line()})")
        print(f"explore: {_app_line(args.out, args.store)}")
        if failed:
            print(f"lens: {len(failed)} of {len(rows)} studies failed: {', '.join(failed)} "
                  f"(details in {Path(args.out) / 'main_job.json'})", file=sys.stderr)
            return 1
        return 0
    if args.resume:
        raise LensInputError("--resume keeps the finished studies of `lens study all`; a single study has "
                             f"nothing to keep (got study {args.name!r})")
    study = get_study(args.name)
    config = config_from_dict(study.config, {**base, **params, **_target_params(args.name, args.precision, params)})
    t0 = time.time()
    out = run_study(study, config, args.out)
    print(f"{args.name}: wrote {out} ({time.time() - t0:.1f} s)")


def _target_params(name: str, precision: list, params: dict) -> dict:
    """The config values ``--precision`` asks of one study (its sample knob and the target), or {}."""
    targets = parse_targets(precision, [name])
    if not targets:
        return {}
    values = target_params(name, targets[name])
    given = [k for k in params if k.replace("-", "_") in values or RENAMED.get(k.replace("-", "_")) in values]
    if given:
        raise LensInputError(f"--precision sets {', '.join(values)} of {name}: leave out --param {given[0]}")
    return values


def _app_line(out, store) -> str:
    """The ``lens app`` line that opens the explorer on what ``lens study all --out OUT`` wrote: its results,
    and the folder of the store it read (``OUT/store`` unless --store named another)."""
    stores = Path(store).parent if store else Path(out)
    return f"lens app --results {shlex.quote(str(out))} --stores {shlex.quote(str(stores))}"


def _cmd_report(args):
    from studies.reporting.report import build_report

    print(f"wrote {build_report(args.path)}")


COMMANDS = {"study": _cmd_study, "report": _cmd_report}
