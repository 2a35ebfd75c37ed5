"""docs/findings.md: every seed claim, judged on each real checkpoint's main job.

``python -m studies.reporting.findings RUN_DIR [RUN_DIR ...] --out docs/findings.md`` reads one main-job results folder per
checkpoint (``main_job.json``, the shared ``store/manifest.json`` and each study's ``result.json``, as
``lens study all --out RUN_DIR`` writes them) and writes one Markdown file: a table of the checkpoints (family,
layers, width, tokens, run times), a verdict matrix (claim × checkpoint) and one table per seed claim with the
measured value, its interval, its values on nested subsamples, its null and the verdict.

Nothing here judges anything: the values, intervals and verdicts are :func:`studies.reporting.headlines.judged`'s (the
claims and rules are declared per study in ``studies/<study>/declaration.py``), the stability marks and nulls are
:mod:`studies.core.stability`'s. A study that did not apply to a model (``n/a`` in main_job.json) is listed as
"not applicable" with the job's reason; one that failed, never ran or whose folder is missing is a stated gap.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from lens.errors import LensInputError
from lens.store.layout import is_store
from studies.reporting.results import git_revision, machine_line, read_result, store_read
from studies.job.rows import JOB_FILE, MainJobRecord, Status
from studies.core.contract import NOT_APPLICABLE, VERDICTS
from studies.reporting.headlines import declared_claims, format_value, judged, nested_text, verdict_text
from studies.core.registry import STUDIES
from lens.runtime.atomic import write_text_atomic
from lens.store.fidelity import SILENTLY_WRONG, verdict_line
from lens.store.format import load_manifest

COMMAND = "python -m studies.reporting.findings"
CHECKPOINTS_WANTED = 3  # issue #23: "at least three real checkpoints of different families"


@dataclass
class Run:
    """One checkpoint's main job as read back."""

    folder: Path
    job: MainJobRecord  # its main_job.json
    model: dict = field(default_factory=dict)  # the store manifest's model card ({} when no store was kept)
    store_tokens: int | None = None
    store_wrong: str = ""  # the store's fidelity verdict line when it is silently wrong (lens.store.fidelity)

    @property
    def model_id(self) -> str:
        return str(self.model.get("model_id") or self.job.model or self.folder.name)

    @property
    def family(self) -> str:
        return str(self.model.get("model_type") or "?")

    def describe(self, n_tokens=None) -> str:
        """``smollm2-135m (llama, 30 layers, d 576, 20000 tokens)``."""
        parts = [self.family]
        if self.model.get("n_layers") is not None:
            parts.append(f"{self.model['n_layers']} layers")
        if self.model.get("d_model") is not None:
            parts.append(f"d {self.model['d_model']}")
        tokens = n_tokens if n_tokens is not None else self.store_tokens
        if tokens is not None:
            parts.append(f"{tokens} tokens")
        return f"{self.model_id} ({', '.join(parts)})"

    def rows(self) -> dict:
        """study -> its row in main_job.json."""
        return self.job.rows


def _known(value) -> str:
    """A main_job.json field as the table shows it: ``?`` where the file does not record it."""
    return "?" if value is None else str(value)


def read_run(folder) -> Run:
    """A main-job results folder; a :class:`LensInputError` (one line) for anything else."""
    folder = Path(folder)

    file = folder / JOB_FILE
    what = f"{folder} is not a main-job results folder: expected {JOB_FILE} as `lens study all --out DIR` writes it"
    if not file.is_file():
        raise LensInputError(what)
    try:
        job = MainJobRecord.read(file)  # parsed and checked once
    except LensInputError as exc:
        raise LensInputError(f"{what} ({exc})") from None
    if not job.has_studies or "model" in job.absent:
        raise LensInputError(f"{what} ({file} has no model and studies list)")
    run = Run(folder, job)
    store = _store_of(folder, job.store)
    if store is not None:
        try:
            manifest = load_manifest(store)
        except Exception:  # noqa: BLE001 - a damaged store: the checkpoint is described from main_job.json alone
            manifest = None
        run.model = dict(manifest.model) if manifest is not None else {}
        run.store_tokens = manifest.n_tokens if manifest is not None else None
        # load_manifest checked the record (a merged store's: its worst part)
        record = manifest.fidelity_record if manifest is not None else None
        if record is not None and record.verdict == SILENTLY_WRONG:
            run.store_wrong = verdict_line(record)
    return run


def _store_of(folder: Path, named) -> Path | None:
    """The job's shared store: ``store`` in main_job.json is as the job was given it (``results/store``, relative
    to where it ran) or absent (``DIR/store``); found as every result's store is
    (:func:`studies.reporting.results.store_read`), else ``DIR/store``."""
    return store_read(named, folder) or (folder / "store" if is_store(folder / "store") else None)


def code_commit() -> str:
    return git_revision()


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _seconds(value) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "—"
    m, s = divmod(int(round(value)), 60)
    return f"{value:.0f} s ({m}:{s:02d})"


@dataclass
class Finding:
    """One claim on one checkpoint."""

    study: str
    measure: str
    claim: str
    source: str
    rule: str
    checkpoint: str
    model_id: str
    value: str = ""
    interval: str = ""
    null: str = ""
    verdict: str = ""
    judged: dict | None = None  # judged()'s row when the study ran


def findings_for(run: Run) -> list[Finding]:
    """Every declared claim of every registered study on one checkpoint, in registry order."""
    rows = run.rows()
    out = []
    for study in STUDIES:
        claims = declared_claims(study)
        row = rows.get(study)
        status = row.get("status") if row else None
        record, gap = None, None
        if status == Status.OK:
            try:
                record = read_result(run.folder / study)
            except LensInputError as exc:
                gap = f"not measured: main_job.json says ok but the result cannot be read ({exc})"
        elif status == Status.NOT_APPLICABLE:
            gap = f"{NOT_APPLICABLE}: {row.get('error') or 'the study does not apply to this model'}"
        elif status == Status.FAILED:
            gap = f"not measured: the study failed ({row.get('error')})"
        elif row is None:
            gap = "not measured: the study is not in this main job"
        else:
            gap = f"not measured: the study is {status} (the job had not finished)"
        if record is not None:
            for j in judged(record):
                out.append(Finding(study, j["measure"], j["claim"], j["source"], j["rule"],
                                   run.describe(record.n_tokens), run.model_id,
                                   value=(j["text"] + " " + j["unit"]).strip() if j["value"] is not None else "—",
                                   interval=j["interval"] or "—", null=_null_text(j),
                                   verdict=verdict_text(j) if j["value"] is not None or j["reason"]
                                   else f"{NOT_APPLICABLE}: the result holds no value for this measure",
                                   judged=j))
            continue
        for c in claims:
            out.append(Finding(study, c.measure, c.claim, c.source, c.rule.text, run.describe(), run.model_id,
                               value="—", interval="—", null="—", verdict=gap))
    return out


def _null_text(j: dict) -> str:
    """``0.143 (p = 0.005)``: the headline under the study's null and its p-value; ``—`` without a null."""
    if j.get("null_p") is None:
        return "—"
    return f"{format_value(j.get('null'))} (p = {format_value(j['null_p'])})"


def _verdict_word(f: Finding) -> str:
    # the judged row's own word: the verdict text goes on with its reason or qualifiers ("agrees (with ...)")
    word = f.judged["verdict"] if f.judged and f.value != "—" else f.verdict.split(":", 1)[0]
    if word in VERDICTS:
        unstable = bool(f.judged and f.judged.get("unstable"))
        wrong = bool(f.judged and f.judged.get("store_mark"))  # its store's fidelity check is silently wrong
        return word + (" (unstable)" if unstable else "") + (" (store SILENTLY WRONG)" if wrong else "")
    return "not measured"


def _checkpoint_tables(runs: list[Run]) -> list[str]:
    """The checkpoints table (model card, tokens, corpus, wall times, machine) and each study's run time."""
    lines = ["## Checkpoints", "",
             "| model | family | architecture | layers | d_model | vocab | LM head | tokens captured (--max-tokens) "
             "| corpus | source | main job wall time | capture | machine |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        m = r.model
        lines.append("| " + " | ".join(_cell(x) for x in (
            r.model_id, r.family, m.get("architecture", "?"), m.get("n_layers", "?"), m.get("d_model", "?"),
            m.get("d_vocab", "?"), {True: "yes", False: "no"}.get(m.get("has_lm_head"), "?"),
            f"{r.store_tokens if r.store_tokens is not None else '?'} ({_known(r.job.max_tokens)})",
            _known(r.job.corpus), m.get("source", "?"),
            _seconds(r.job.wall_time_s) + ("" if r.job.finished else " so far: **the job had not "
                                           "finished** when this file was generated"),
            _seconds(r.job.capture_s),
            r.job.machine or "not recorded")) + " |")
    lines += ["", "Study run times (seconds, from each main_job.json; `n/a`: the study does not apply):", "",
              "| study | " + " | ".join(_cell(r.model_id) for r in runs) + " |",
              "|---|" + "---|" * len(runs)]

    for study in STUDIES:
        cells = []
        for r in runs:
            row = r.rows().get(study)
            if row is None:
                cells.append("not run")
            elif row.get("status") == "ok":
                sec = row.get("seconds")
                cells.append(f"{sec:.1f}" if isinstance(sec, (int, float)) else str(sec))
            else:
                cells.append(str(row.get("status")))
        lines.append(f"| {study} | " + " | ".join(cells) + " |")
    return lines


def render(runs: list[Run], argv: list[str], seconds: float | None = None, per_run=None, notes=()) -> str:
    """The whole Markdown file (``per_run``: :func:`findings_for` of each run, when already computed)."""
    per_run = [findings_for(r) for r in runs] if per_run is None else per_run
    families = sorted({r.family for r in runs})
    lines = ["# Findings: the seed claims judged on real checkpoints", "",
             f"Generated by `{' '.join([COMMAND, *argv])}` (regenerate with that command after the main jobs; "
             "the file is written whole, nothing in it is edited by hand).", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"- code commit: `{code_commit()}` (the commit each result was computed at is in its result.json: "
             + ", ".join(sorted({f'`{c}`' for c in _revisions(runs)})) + ")",
             f"- CPU: {machine_line()} (where this file was generated; each main job's own machine is in the "
             "checkpoints table when its main_job.json records it)",
             *([f"- generator run time: {seconds:.1f} s (reading the folders and judging)"] if seconds is not None
               else []), ""]
    n = len(runs)
    lines += [f"**{n} checkpoint{'s' if n != 1 else ''} of {len(families)} famil{'ies' if len(families) != 1 else 'y'}"
              f" ({', '.join(families)}).** "
              + (f"Issue #23 asks for at least {CHECKPOINTS_WANTED} real checkpoints of different families that "
                 f"install offline; only {'this one was' if n == 1 else f'these {n} were'} available here, so "
                 "this table falls short of it. "
                 if n < CHECKPOINTS_WANTED or len(families) < CHECKPOINTS_WANTED else "")
              + "Each ran one main job (`lens study all`) with the studies' default settings; nothing was re-run, "
                "tuned or left out after seeing a value.", "", *[line for n in notes for line in (f"Note: {n}", "")]]
    for r in runs:  # a job read while it runs (or after it was stopped): its missing claims are not measured yet
        if not r.job.finished:
            left = [str(x.get("study")) for x in r.rows().values() if x.get("status") in ("running", "waiting")]
            lines += [f"**Partial job: {r.model_id}** (`{r.folder}`) had not finished when this file was generated"
                      + (f" ({r.job.stopped})" if r.job.stopped is not None else "")
                      + f"; not measured yet: {', '.join(left) or 'none'}.", ""]
    for r in runs:  # results read from a store whose capture is not what the model computes: every verdict marked
        if r.store_wrong:
            lines += [f"**Store silently wrong: {r.model_id}** (`{r.folder}`): its store's fidelity check reads "
                      f"{r.store_wrong}. Its verdicts are marked and cannot carry a claim.", ""]
    lines += ["Verdicts are those of `studies.reporting.headlines.judged` — the one rule each study declares per claim "
              "(`studies/<study>/declaration.py`), the same the explorer and the report show: **agrees** (inside "
              "the paper's claimed range), **weaker** (the paper's direction, short of its threshold), "
              "**contradicts**, **undecided** (the value's 95% interval straddles the rule's threshold), "
              "**not applicable** (with the reason). Each claim is judged on the paper's own statistic (named "
              "under each claim with where the paper reports it); where ours is a different instrument the "
              "verdict says so. *N/4 / N/2 / N*: the value on nested subsamples of the documents (or windows), "
              "marked unstable when a smaller one moves from the full value by more than its interval "
              "(`studies/core/stability.py`); *null p*: the add-one p-value against the study's null. An unstable value's verdict is shown but "
              "cannot carry the claim: raise the sample.", ""]
    lines += _checkpoint_tables(runs)
    lines += ["", "## Verdicts at a glance", "",
              "| study | measure | " + " | ".join(_cell(r.model_id) for r in runs) + " |",
              "|---|---|" + "---|" * len(runs)]
    keys = []
    for fs in per_run:
        for f in fs:
            if (f.study, f.measure) not in keys:
                keys.append((f.study, f.measure))
    by = [{(f.study, f.measure): f for f in fs} for fs in per_run]
    for key in keys:
        cells = [_verdict_word(b[key]) if key in b else "not measured" for b in by]
        lines.append(f"| {key[0]} | {_cell(key[1])} | " + " | ".join(cells) + " |")
    lines += ["", "## Each claim", ""]
    for key in keys:
        first = next(b[key] for b in by if key in b)
        lines += [f"### {first.study}: {first.measure}", "",
                  f"Claim: {first.claim} — *{first.source}*.  ",
                  *([f"Paper's statistic: {first.judged['paper']}  "] if first.judged and first.judged["paper"] else []),
                  *([f"Ours: {first.judged['method']}  "] if first.judged and first.judged["method"] else []),
                  f"Rule: {first.rule}.", "",
                  "| checkpoint | measured | 95% interval | N/4 / N/2 / N | null | verdict |",
                  "|---|---|---|---|---|---|"]
        for b in by:
            f = b.get(key)
            if f is None:
                continue
            lines.append("| " + " | ".join(_cell(x) for x in (
                f.checkpoint, f.value, f.interval, nested_text(f.judged) if f.judged else "—", f.null,
                f.verdict)) + " |")
        lines.append("")
    return "\n".join(lines)


def _revisions(runs: list[Run]) -> set:
    revs = set()
    for r in runs:
        for study, row in r.rows().items():
            if row.get("status") == "ok":
                try:
                    revs.add(read_result(r.folder / study).git_revision or "unknown")
                except LensInputError:
                    continue
    return revs or {"none"}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a main-job results folder (lens study all --out)")
    parser.add_argument("--out", default="docs/findings.md", help="the Markdown file to write (default %(default)s)")
    parser.add_argument("--note", action="append", default=[], help="a sentence printed under the summary "
                        "(how the runs were made where it is not in main_job.json); repeatable")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        runs = [read_run(p) for p in args.runs]
        per_run = [findings_for(r) for r in runs]
    except LensInputError as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        return 2
    text = render(runs, argv, time.perf_counter() - t0, per_run, args.note)

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(args.out), text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
