"""The main job: every available study on one model and corpus, one shared store, one report.

``lens study all --model M --corpus C --out DIR`` lays out::

    DIR/store/            # captured once (embed + resid_post, all layers), reused by every study
    DIR/<study>/          # one results folder per study
    DIR/main_job.json     # what ran: status, wall time and error per study, total wall time
    DIR/report.html       # studies.report.build_report(DIR)

A failing study does not stop the others: its error is recorded and the job raises
:class:`StudiesFailed` at the end (the CLI exits 1), after the report has been written.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path

from lens.errors import LensInputError

log = logging.getLogger(__name__)

JOB_FILE = "main_job.json"
# Sites captured into the shared store; a study module may declare more in a ``SITES`` tuple. Until the
# studies declare theirs, this table holds what their defaults need beyond the shared sites (logit-lens
# also decodes resid_mid: capturing it here saves that study a second capture of resid_post).
SHARED_SITES = ("embed", "resid_post")
EXTRA_SITES = {"logit-lens": ("resid_mid",)}


class StudiesFailed(RuntimeError):
    """Some studies failed; ``rows`` holds every study's outcome."""

    def __init__(self, rows: list[dict]):
        self.rows = rows
        failed = [r for r in rows if r["status"] != "ok"]
        detail = "; ".join(f"{r['study']} ({r['error']})" for r in failed)
        super().__init__(f"{len(failed)} of {len(rows)} studies failed: {detail}")


def select_studies(only=None) -> list[str]:
    """Available study names, in registry order, restricted to ``only`` (comma string or list)."""
    from studies.registry import STUDIES, available

    names = list(available())
    if only is None or only == "":
        return names
    wanted = [s.strip() for s in (only.split(",") if isinstance(only, str) else only) if s.strip()]
    unknown = [s for s in wanted if s not in STUDIES]
    if unknown:
        raise LensInputError(f"--only: unknown studies {', '.join(unknown)} (expected some of {', '.join(STUDIES)})")
    missing = [s for s in wanted if s not in names]
    if missing:
        raise LensInputError(f"--only: studies not available in this version: {', '.join(missing)}")
    return [s for s in names if s in wanted]


def _study_params(module, params: dict) -> dict:
    fields = {f.name for f in dataclasses.fields(module.Config)}
    return {k: v for k, v in params.items() if k.replace("-", "_") in fields}


def _check_params(modules: dict, params: dict) -> None:
    for key in params:
        name = key.replace("-", "_")
        if not any(name in {f.name for f in dataclasses.fields(m.Config)} for m in modules.values()):
            raise LensInputError(f"--param {key}: none of the selected studies has this parameter")


def _shared_store(base: dict, out: Path, modules: dict, progress: bool) -> str:
    """Capture the shared store once (resuming an interrupted capture); returns its path."""
    import lens
    from studies.common import cached_model

    path = Path(base["store"]) if base.get("store") else out / "store"
    sites = list(SHARED_SITES)
    for name, m in modules.items():
        sites += [s for s in (getattr(m, "SITES", None) or EXTRA_SITES.get(name, ())) if s not in sites]
    manifest = path / "manifest.json"
    if manifest.is_file():
        store = lens.open_store(path)
        if store.complete:
            return str(path)
    model = cached_model(base["model"], base.get("device", "cpu"))
    lens.capture(model, corpus=base.get("corpus", "wiki-sample"), sites=sites, layers="all",
                 max_tokens=base.get("max_tokens"), seq_len=base.get("seq_len", 128),
                 batch_size=base.get("batch_size", 8), out=str(path), resume=manifest.is_file(),
                 progress=progress)
    return str(path)


def _run_one(name: str, module, base: dict, params: dict, out: Path) -> dict:
    from studies.common import config_from_dict
    from studies.headlines import one_line
    from studies.results import read_result

    t0 = time.time()
    row = {"study": name, "status": "ok", "seconds": None, "out": str(out / name), "line": "", "error": None}
    try:
        values = {**base, **_study_params(module, params)}
        config = config_from_dict(module.Config, {k: v for k, v in values.items()
                                                  if k in {f.name for f in dataclasses.fields(module.Config)}})
        try:
            module.run(config, out / name)
        except LensInputError as exc:
            if "lacks" not in str(exc) or config.store is None:
                raise
            # The shared store lacks a site or layer this study needs: let it capture its own.
            log.warning("%s: shared store does not fit (%s); capturing its own", name, exc)
            own = dataclasses.replace(config, store=str(out / name / "store"))
            module.run(own, out / name)
        row["line"] = one_line(read_result(out / name))
    except Exception as exc:  # a failing study must not stop the others; it is reported at the end
        log.exception("study %s failed", name)
        row["status"] = "failed"
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["line"] = f"FAILED {row['error']}"
    row["seconds"] = round(time.time() - t0, 2)
    return row


def run_all(base: dict, out_dir, only=None, params: dict | None = None, progress: bool = True) -> list[dict]:
    """Run every available study (or those in ``only``) and write ``out_dir/report.html``.

    ``base``: the shared config fields (model, corpus, max_tokens, seq_len, batch_size, device, store,
    seed, progress); ``params``: study-specific fields, each given to the studies that have it.
    Returns one row per study {study, status, seconds, out, line, error}; raises
    :class:`StudiesFailed` after writing the report when any study failed.
    """
    from tqdm.auto import tqdm

    from studies.registry import get_study
    from studies.report import build_report

    t_start = time.time()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    params = dict(params or {})
    names = select_studies(only)
    if not names:
        raise LensInputError("no studies are available to run")
    modules = {n: get_study(n) for n in names}
    _check_params(modules, params)
    base = dict(base)
    base["progress"] = bool(base.get("progress", progress)) and progress
    t_capture = time.time()
    base["store"] = _shared_store(base, out, modules, progress)
    capture_s = round(time.time() - t_capture, 2)

    rows = []
    bar = tqdm(names, desc="studies", unit="study", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        row = _run_one(name, modules[name], base, params, out)
        rows.append(row)
        text = f"{name:<17} {row['status']:<6} {row['seconds']:>7.1f} s  {row['line']}"
        log.info(text)
        if progress:
            bar.write(text)
    bar.close()

    job = {"model": base.get("model"), "corpus": base.get("corpus"), "max_tokens": base.get("max_tokens"),
           "store": base["store"], "capture_s": capture_s, "wall_time_s": round(time.time() - t_start, 2),
           "studies": rows, "params": {k: str(v) for k, v in params.items()},
           "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = out / (JOB_FILE + ".tmp")
    tmp.write_text(json.dumps(job, indent=1), encoding="utf-8")
    os.replace(tmp, out / JOB_FILE)
    report = build_report(out)
    log.info("wrote %s (%.1f s in all)", report, job["wall_time_s"])
    if any(r["status"] != "ok" for r in rows):
        raise StudiesFailed(rows)
    return rows
