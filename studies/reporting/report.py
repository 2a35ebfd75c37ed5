"""The HTML report: every figure of every results folder under a path, headline numbers beside the
seed claims, and provenance — one self-contained file (plotly.js inlined once, works offline).

It reads only results folders (``studies.reporting.results.find_results``) and, when present, the main job's
``main_job.json`` (per-study status and wall time).
"""

from __future__ import annotations

import html
import json
import logging
from pathlib import Path

import plotly.offline

from lens.errors import LensInputError
from studies.job.rows import JOB_FILE, MainJobRecord, Status
from studies.reporting.headlines import format_value, headlines_for, judged, nested_text, verdict_text
from studies.core.registry import declaration
from lens.store.fidelity import describe
from lens.store.format import load_manifest
from lens.runtime.atomic import write_text_atomic
from studies.reporting.results import find_results, store_read

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:1em 0;font-size:.92em} th,td{border:1px solid #ddd;padding:.35em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num{font-family:ui-monospace,monospace;text-align:right} .failed{color:#b00020} .na{color:#777}
td.agrees{background:#e6f4ea} td.weaker{background:#fff4d6} td.contradicts{background:#fde7e9} td.undecided{background:#eef0f4} td.not-applicable{color:#777}
.partial{background:#fff4d6;padding:.5em .8em;border-left:4px solid #e0a800} .fig{margin:1em 0 2em 0} .muted{color:#777;font-size:.9em} code{background:#f4f4f4;padding:0 .2em}
"""


def _script_json(obj) -> str:
    """JSON safe inside a <script> element (no '</' can close it early)."""
    return json.dumps(obj).replace("</", "<\\/").replace("<!--", "<\\!--")


def _read_job(root: Path) -> MainJobRecord | None:
    """The main job's record in ``root``, None where there is none or it cannot be read (the report is then built
    from the results alone)."""
    path = root / JOB_FILE
    if not path.is_file():
        return None
    try:
        return MainJobRecord.read(path)
    except LensInputError:  # unreadable, not UTF-8, not JSON, not a job's record
        return None


def _summary_table(records) -> str:
    rows = []
    for rec in records:
        heads = headlines_for(rec)
        if not heads:  # a study without registered headlines: show its first scalar summaries
            heads = [{"label": _label(rec.study, k), "text": _short(v), "claim": ""}
                     for k, v in list(rec.summary.items())[:3]]
        for h in heads:
            rows.append(f"<tr><td>{html.escape(rec.study)}</td><td>{html.escape(rec.model)}</td>"
                        f"<td>{html.escape(h['label'])}</td><td class=num>{html.escape(h['text'])}</td>"
                        f"<td>{html.escape(h['claim'])}</td></tr>")
    if not rows:
        return "<p>No results yet.</p>"
    return ("<table><tr><th>study</th><th>model</th><th>measure</th><th>ours</th><th>seed claim</th></tr>"
            + "".join(rows) + "</table>")


def _label(study: str, key: str) -> str:
    """``key``'s declared label and unit (the key itself for an undeclared name)."""
    found = declaration(study)
    return key if found is None else found.result.label(key)


def _axis_title(rec) -> str:
    """The layer axis ``rec``'s run read (its recorded site; the declared axis for a result without one)."""
    found = declaration(rec.study)
    axis = rec.layer_axis if found is None else found.result.axis(rec)
    return "" if axis is None else axis.title


def _anchor(rec, root: Path) -> str:
    """The HTML id of a result's section (unique: two runs of one study get two)."""
    try:
        where = rec.path.relative_to(root)
    except ValueError:
        where = rec.path
    return "-".join(where.parts) or rec.study


def _findings_table(records, root: Path) -> str:
    """Each seed claim judged by its one declared rule (studies.reporting.headlines.judged), linked to its figure."""
    rows = []
    for rec in records:
        for j in judged(rec):
            saved = (rec.path / "figures" / f"{j['figure']}.json").is_file()
            link = f"#{_anchor(rec, root)}" + (f"--{j['figure']}" if saved else "")  # else: the study's section
            rows.append(f"<tr><td>{html.escape(rec.study)}</td><td>{html.escape(j['measure'])}</td>"
                        f"<td class=num>{html.escape((j['text'] + ' ' + j['unit']).strip())}</td>"
                        f"<td class=num>{html.escape(j['interval'])}</td>"
                        f"<td class=num>{html.escape(nested_text(j))}</td>"
                        f"<td class='{j['verdict'].replace(' ', '-')}'>{html.escape(verdict_text(j))}</td>"
                        f"<td>{html.escape(j['rule'])}</td><td>{html.escape(j['claim'])} "
                        f"<span class=muted>({html.escape(j['source'])})</span>"
                        + (f"<br><span class=muted>paper: {html.escape(j['paper'])}</span>" if j['paper'] else "")
                        + (f"<br><span class=muted>ours: {html.escape(j['method'])}</span>" if j['method'] else "")
                        + "</td>"
                        f"<td><a href='{html.escape(link)}'>figure</a></td></tr>")
    if not rows:
        return ""
    return ("<h2>Judged findings</h2><p class=muted>Each seed claim, our measured value (95% interval where the "
            "study has one), the value on nested subsamples (N/4, N/2, N) and the verdict of the one rule the study "
            "declares on the paper's statistic: agrees, weaker, contradicts, or undecided when the interval "
            "straddles the rule's threshold.</p>"
            "<table><tr><th>study</th><th>measure</th><th>ours</th><th>95% interval</th><th>N/4 / N/2 / N</th>"
            "<th>verdict</th>"
            "<th>rule</th><th>seed claim</th><th></th></tr>" + "".join(rows) + "</table>")


def _short(value) -> str:
    if isinstance(value, (dict, list)):
        text = json.dumps(value)
        return text if len(text) < 80 else text[:77] + "…"
    return format_value(value)


def _provenance(records, job: dict | None) -> str:
    models = sorted({r.model for r in records})
    corpora = sorted({r.corpus for r in records})
    tokens = sorted({r.n_tokens for r in records})
    revs = sorted({r.git_revision for r in records if r.git_revision})
    versions = {}
    for r in records:
        versions.update(r.versions or {})
    items = [("model", ", ".join(models)), ("corpus", ", ".join(corpora)),
             ("tokens per study", ", ".join(str(t) for t in tokens)), ("git revision", ", ".join(revs)),
             ("library versions", ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))]
    if job:
        items.append(("main job wall time", f"{job.wall_time_s or 0:.1f} s "
                                            f"(capture {job.capture_s or 0:.1f} s, max_tokens {job.max_tokens})"))
        items.append(("finished", str(job.finished or "no: a partial job")))
    else:
        total = sum(r.wall_time_s or 0 for r in records)
        items.append(("studies' wall time (sum)", f"{total:.1f} s"))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items)
    return f"<table>{body}</table>"


def _recorded_stores(records, job: MainJobRecord | None, root: Path) -> list[Path]:
    """The stores the results read (each result's ``config.store``, the main job's ``store``), found as
    recorded or, after the results folder moved, by their last path components under ``root``."""
    recorded = ([job.store] if job else []) + [(r.config or {}).get("store") for r in records]
    found: list[Path] = []
    for rec in dict.fromkeys(p for p in recorded if isinstance(p, str) and p):
        hit = store_read(rec, root)
        if hit is not None and hit.resolve() not in {f.resolve() for f in found}:
            found.append(hit)
    return found


def _fidelity(stores: list[Path]) -> str:
    """Each store's fidelity record (lens.store.fidelity): the verdict, and the record under it."""
    if not stores:
        return ""
    rows = []
    for path in stores:
        try:
            lines = describe(load_manifest(path))
        except LensInputError as exc:  # a damaged or unreadable store: said, the report still builds
            lines = [f"the store's manifest cannot be read: {exc}"]
        cls = " class=failed" if lines[0].startswith(("SILENTLY WRONG", "the store's manifest")) else ""
        more = ("<details><summary>record</summary><pre>" + html.escape("\n".join(lines[1:])) + "</pre></details>"
                if len(lines) > 1 else "")
        rows.append(f"<tr><th>{html.escape(str(path))}</th><td{cls}>{html.escape(lines[0])}{more}</td></tr>")
    return ("<h3>Store fidelity</h3><p class=muted>At capture, the first windows re-run through the plain Hugging "
            "Face forward and compared with what the store holds (per site kind, the last layer's lens against "
            "the logits).</p><table>" + "".join(rows) + "</table>")


def _partial_note(job: MainJobRecord | None) -> str:
    """A banner over a report of a main job that has not finished: still running (the job rebuilds the report
    as each study ends) or stopped before the end (Ctrl-C, SIGTERM), with the studies not yet done."""
    if not job or job.finished or not job.studies:
        return ""
    rows = job.row_list()
    left = [r.get("study", "?") for r in rows if r.get("status") in (Status.RUNNING, Status.WAITING)]
    done = len(rows) - len(left)
    how = (f"the job stopped before it finished ({job.stopped})" if job.stopped is not None else
           "the job is still running; this report is rebuilt as each study finishes")
    return (f"<p class=partial><b>Partial job: {done} of {len(rows)} studies done</b> — {html.escape(how)}. "
            f"Not in this report yet: {html.escape(', '.join(left) or 'none')}.</p>")


def _precision_table(records) -> str:
    """Each study's declared headline with the half-width its 95% interval reached beside the target (issue #38:
    ``result.json``'s ``extra.precision``; results from before it have none and are left out)."""
    rows = []
    for rec in records:
        p = (rec.extra or {}).get("precision")
        if not isinstance(p, dict):
            continue
        hw, target = p.get("half_width"), p.get("target")
        state = {True: "reached", False: "<b>not reached</b>", None: "no interval"}.get(p.get("reached"), "")
        rows.append(f"<tr><td>{html.escape(rec.study)}</td><td>{html.escape(str(p.get('headline', '')))}</td>"
                    f"<td class=num>{'—' if hw is None else f'±{hw:.3g}'}</td>"
                    f"<td class=num>{'—' if target is None else f'±{target:g}'}"
                    f"{' (--precision)' if p.get('requested') else ''}</td>"
                    f"<td class=num>{html.escape(str(p.get('sample')))} ({html.escape(str(p.get('knob', '')))})</td>"
                    f"<td>{state}</td></tr>")
    if not rows:
        return ""
    return ("<h2>Precision</h2><table><tr><th>study</th><th>headline</th><th>95% half-width</th><th>target</th>"
            "<th>sample</th><th></th></tr>" + "".join(rows) + "</table>")


def _job_table(job: MainJobRecord | None) -> str:
    if not job or not job.studies:
        return ""
    rows = []
    for r in job.row_list():
        cls = {Status.FAILED: " class=failed", Status.NOT_APPLICABLE: " class=na"}.get(r.get("status"), "")
        rows.append(f"<tr{cls}><td>{html.escape(r['study'])}</td><td>{html.escape(r.get('status', ''))}</td>"
                    f"<td class=num>{(r.get('seconds') or 0):.1f}</td><td>{html.escape(r.get('line') or '')}</td></tr>")
    return ("<h2>Studies run</h2><table><tr><th>study</th><th>status</th><th>seconds</th><th>summary</th></tr>"
            + "".join(rows) + "</table>")


def _figures(records, root: Path) -> str:
    parts, n = [], 0
    for rec in records:
        folder = rec.path / "figures"
        files = sorted(folder.glob("*.json")) if folder.is_dir() else []
        try:
            where = rec.path.relative_to(root)
        except ValueError:
            where = rec.path
        anchor = _anchor(rec, root)  # unique: two runs of one study get two anchors
        parts.append(f"<h2 id='{html.escape(anchor)}'>{html.escape(rec.study)} "
                     f"<span class=muted>{html.escape(rec.model)} · {html.escape(rec.corpus)} · "
                     f"{rec.n_tokens} tokens · <code>{html.escape(str(where))}</code></span></h2>")
        if _axis_title(rec):
            parts.append(f"<p class=muted>layer axis: {html.escape(_axis_title(rec))}</p>")
        if not files:
            parts.append("<p class=muted>no figures saved</p>")
        for f in files:
            try:
                fig = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError, RecursionError):
                parts.append(f"<p class=failed>figure {html.escape(f.name)} is not valid JSON</p>")
                continue
            n += 1
            parts.append(f"<a id='{html.escape(anchor)}--{html.escape(f.stem)}'></a>")
            parts.append(f"<div class=fig id='fig{n}' data-figure='{html.escape(rec.study)}/{html.escape(f.stem)}'></div>"
                         f"<script type='application/json' id='fig{n}-data'>{_script_json(fig)}</script>")
    return "".join(parts), n


def _skipped_list(skipped: list, root: Path) -> str:
    """The results folders left out because their record cannot be read, and why."""
    if not skipped:
        return ""
    items = "".join(f"<li><code>{html.escape(str(Path(folder).relative_to(root)))}</code>: "
                    f"{html.escape(why.replace(f'{root}/', ''))}</li>" for folder, why in skipped)
    return f"<p><b>{len(skipped)} results folder(s) left out</b>, their record cannot be read (run the study again):</p><ul>{items}</ul>"


def build_report(path) -> Path:
    """Write ``path/report.html`` from every results folder under ``path``; returns the file."""


    root = Path(path)
    if not root.is_dir():
        raise LensInputError(f"{root} is not a folder of results")
    skipped: list = []
    records = find_results(root, skipped)
    for folder, why in skipped:
        log.warning("left out of the report: %s", why)
    job = _read_job(root)
    if not records and job is None:
        raise LensInputError(f"no results folders (result.json) under {root}")
    figures_html, n_figs = _figures(records, root)
    title = "Lens Workbench report — " + (", ".join(sorted({r.model for r in records})) or "no results")
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{_CSS}</style>
<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script></head>
<body><h1>{html.escape(title)}</h1>
<p class=muted>{len(records)} results folders, {n_figs} figures. Rebuild with <code>lens report {html.escape(str(root))}</code>.</p>
{_partial_note(job)}
{_skipped_list(skipped, root)}
{_findings_table(records, root)}
<h2>Headline numbers</h2>{_summary_table(records)}
{_precision_table(records)}
<h2>Provenance</h2>{_provenance(records, job)}
{_fidelity(_recorded_stores(records, job, root))}
{_job_table(job)}
{figures_html}
<script>
document.querySelectorAll("div.fig").forEach(function(div){{
  var fig = JSON.parse(document.getElementById(div.id + "-data").textContent);
  Plotly.newPlot(div, fig.data || [], fig.layout || {{}}, {{responsive: true}});
}});
</script></body></html>
"""
    out = root / REPORT_FILE
    write_text_atomic(out, doc)  # a full disk or a read-only folder leaves the old report and no .tmp
    return out
