"""Sample-size curves: each study's precision headline and its 95% interval at 4-5 sample sizes (issue #38).

Runs ``lens study NAME`` at each size of :data:`CURVES` on one shared store (``--store``, the main job's, so every
size reads the same tokens and only the study's own sample changes), one at a time with one thread
(``LENS_NUM_THREADS=1``: the machine is shared), keeping each run's results folder under ``--runs`` so that a
second call only runs what is missing; then prints one table per study (sample, headline, interval, half-width,
the study's seconds) as markdown — docs/sample_sizes.md is this output::

    LENS_NUM_THREADS=1 python benchmarks/sample_size_curves.py --store results/store --runs /tmp/curves \\
        --reference results > docs/sample_sizes.md

``--reference``: a main job's folder whose results count as one more point of each curve (today's larger
sample), so the largest size is not run twice. ``--only``: some studies. ``--table-only``: print, run nothing.
The knob each curve turns and the headline it reads are the study's declared precision
(``PRECISION`` in studies/<study>/declaration.py; :mod:`studies.core.precision`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the sizes each curve is measured at (the study's declared knob), in the order they are run: round i runs every
# study's i-th size, so the likely defaults come first; the tables sort them
CURVES: dict[str, tuple[int, ...]] = {
    "logit-lens": (256, 1280, 512, 2048),
    "layer-ablation": (256, 1280, 512),
    "filler-tokens": (1000, 2000, 4000),
    "probes": (500, 1280, 2000),
    "context-memory": (1000, 2000),
    "anisotropy": (2500, 5000, 1280),
    "senses": (50,),
    "context-knob": (60,),
    "linearity": (),  # the default stays every token (see its declaration): the reference point only
    "tuned-lens": (),  # its cost is the translators' training, not the scored sample: the reference point only
    "intrinsic-dim": (),  # its headline's sample is the store's windows (max_tokens): the reference point only
    "prediction-gains": (),  # its sample is the store's (max_tokens): the reference point and its nested values
}
MODEL, CORPUS, MAX_TOKENS = "smollm2-135m", "wiki-sample", 20000


def _declared(study: str):
    from studies.core.precision import declared_precision

    return declared_precision(study)


def run_point(study: str, knob: str, size: int, store: str, runs: Path) -> Path:
    """The results folder of ``study`` at ``knob = size`` (run now unless it is already complete)."""
    out = runs / study / str(size)
    if (out / "result.json").exists():
        return out
    cmd = [sys.executable, "-m", "lens", "study", study, "--model", MODEL, "--corpus", CORPUS,
           "--max-tokens", str(MAX_TOKENS), "--store", store, "--param", f"{knob}={size}", "--quiet",
           "--out", str(out)]
    env = {**os.environ, "LENS_NUM_THREADS": os.environ.get("LENS_NUM_THREADS", "1")}
    t0 = time.time()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    sys.stderr.write(f"{study} {knob}={size}: rc {done.returncode}, {time.time() - t0:.0f} s\n")
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-2000:] + "\n")
    return out


def _point(folder: Path, precision) -> dict | None:
    from studies.reporting.results import read_result

    try:
        rec = read_result(folder)
    except Exception:  # noqa: BLE001 - a missing or broken point is left out of the table
        return None
    value, low, high = precision.read(rec)
    from studies.core.precision import RENAMED, SAMPLE_TOKENS

    sample = rec.config.get(precision.knob)
    if sample is None:  # a result from before the knob's one name: its old name, else the tokens it read
        sample = next((rec.config[k] for k, new in RENAMED.items() if new == precision.knob and k in rec.config),
                      rec.n_tokens)
    if precision.knob == SAMPLE_TOKENS and (not sample or sample > rec.n_tokens):
        sample = rec.n_tokens  # every token of the store: the sample is the store
    return {"sample": sample, "value": value, "low": low, "high": high,
            "seconds": rec.wall_time_s, "n_tokens": rec.n_tokens}


def _fmt(x, digits: int = 4) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def table(study: str, runs: Path, reference: Path | None) -> str:
    p = _declared(study)
    default_dir = _default_folder(study, runs, reference)
    folders = [runs / study / str(n) for n in sorted(CURVES.get(study, ()))]
    points = [_point(f, p) for f in folders]
    for f, pt in zip(folders, points):
        if pt is not None and f == default_dir:
            pt["sample"] = f"{pt['sample']} **default**"
    if reference is not None:
        ref = _point(reference / study, p)
        if ref is not None:
            ref["sample"] = f"{ref['sample']} (reference)" + (" **default**" if reference / study == default_dir else "")
            points.append(ref)
    lines = [f"### {study}", "",
             f"Headline: {p.label} ({p.unit}); declared precision ±{_fmt(p.half_width)} (half-width of the 95% "
             f"interval); knob `{p.knob}`, default {p.default}.", "",
             f"| sample | headline | 95% interval | half-width | reaches ±{_fmt(p.half_width)} | ≥ {p.min_sample} "
             "(10 units) | study seconds |",
             "|---|---|---|---|---|---|---|"]
    for pt in points:
        if pt is None:
            continue
        hw = None if pt["low"] is None or pt["high"] is None else (pt["high"] - pt["low"]) / 2
        ok = "—" if hw is None else ("yes" if hw <= p.half_width else "no")
        n = int(str(pt["sample"]).split()[0])
        lines.append(f"| {pt['sample']} | {_fmt(pt['value'])} | [{_fmt(pt['low'])}, {_fmt(pt['high'])}] | "
                     f"{_fmt(hw, 3)} | {ok} | {'yes' if n >= p.min_sample else 'no'} | {_fmt(pt['seconds'], 3)} |")
    if p.note:
        lines += ["", p.note]
    return "\n".join(lines) + "\n"


def _default_folder(study: str, runs: Path, reference: Path | None) -> Path | None:
    """The result at the study's declared default sample: its curve's point at that size, else the reference when
    the reference ran at the default (the default did not change)."""
    p = _declared(study)
    if p.default in CURVES.get(study, ()):
        return runs / study / str(p.default)
    if reference is not None:
        from studies.reporting.results import read_result

        try:
            config = read_result(reference / study).config
        except Exception:  # noqa: BLE001 - no reference result
            return None
        from studies.core.precision import RENAMED

        names = [p.knob] + [old for old, new in RENAMED.items() if new == p.knob]  # a result from before the rename
        if next((config[k] for k in names if k in config), None) == p.default:
            return reference / study
    return None


def _judged(folder: Path | None) -> list[dict]:
    from studies.reporting.headlines import judged
    from studies.reporting.results import read_result

    try:
        return judged(read_result(folder)) if folder is not None else []
    except Exception:  # noqa: BLE001 - a missing point: its rows say so
        return []


def side_by_side(studies, runs: Path, reference: Path) -> str:
    """Every judged headline at the reference's (today's, larger) samples beside the new default samples: value,
    95% interval and verdict, and whether the verdict moved (issue #38: nothing moves silently)."""
    lines = ["## Every judged headline: today's samples beside the new defaults", "",
             "| study | measure | today: sample | today: value [95%] | today: verdict | new: sample | "
             "new: value [95%] | new: verdict | same verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in studies:
        p = _declared(s)
        old_pt, new_dir = _point(reference / s, p), _default_folder(s, runs, reference)
        new_pt = _point(new_dir, p) if new_dir is not None else None
        old_rows, new_rows = _judged(reference / s), _judged(new_dir)
        for i, row in enumerate(old_rows):
            new = new_rows[i] if i < len(new_rows) else None
            same = "—" if new is None else ("yes" if new["verdict"] == row["verdict"] else
                                            "undecided (interval shown)" if new["verdict"] == "undecided" else "**no**")
            measure = row["measure"].replace("|", "\\|")
            lines.append(f"| {s} | {measure} | {old_pt['sample'] if old_pt else '—'} | {row['text']} "
                         f"{row['interval']} | {row['verdict']} | {new_pt['sample'] if new_pt else 'not run'} | "
                         f"{new['text'] + ' ' + new['interval'] if new else '—'} | {new['verdict'] if new else '—'} | "
                         f"{same} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="the shared store every point reads (a main job's OUT/store)")
    ap.add_argument("--runs", required=True, help="folder of the curves' results (kept: a rerun adds what is missing)")
    ap.add_argument("--reference", default=None, help="a main job's folder: its results are one more point each")
    ap.add_argument("--only", default=None, help="comma list of studies")
    ap.add_argument("--table-only", action="store_true", help="print the tables from --runs, run nothing")
    args = ap.parse_args(argv)
    studies = [s.strip() for s in args.only.split(",")] if args.only else list(CURVES)
    runs = Path(args.runs)
    reference = Path(args.reference) if args.reference else None
    if not args.table_only:
        if not args.store:
            ap.error("--store is needed to run the curves")
        # the smallest sizes of every study first: each curve gets its cheap points before any gets its dear ones
        depth = max(len(CURVES.get(s, ())) for s in studies)
        for i in range(depth):
            for s in studies:
                sizes = CURVES.get(s, ())
                if i < len(sizes):
                    run_point(s, _declared(s).knob, sizes[i], args.store, runs)
    print("# Sample-size curves\n")
    print("Each study's precision headline and its 95% interval at several sample sizes on SmolLM2-135M (issue #38). "
          "The default sample is the smallest size whose interval reached the declared half-width and that holds at "
          "least 10 resampling units (windows of 128 tokens, lemmas, facts): below that, a bootstrap over 2-8 units "
          "gives intervals too narrow to trust (context-knob at 60 facts: no answer moved, interval [0, 0]). Each size "
          "that reached it was re-checked on a second store (4000 tokens of the same model, or another draw of the "
          "corpus' windows); one that missed there is not a default (the study's note gives the numbers): at 10-20 "
          "windows the interval's own width varies by about two between draws. "
          "*study seconds* are the study's own wall time on a 2-core machine that 7 other sessions shared "
          "(load average 10-14 while these ran), so they compare sizes only roughly.\n")
    print(f"Generated by `python benchmarks/sample_size_curves.py {' '.join(argv or sys.argv[1:])}` "
          f"({MODEL}, {CORPUS}, --max-tokens {MAX_TOKENS}; every point one `lens study` on the shared store, "
          "LENS_NUM_THREADS=1, one at a time).\n")
    for s in studies:
        print(table(s, runs, reference))
    if reference is not None:
        print(side_by_side(studies, runs, reference))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
