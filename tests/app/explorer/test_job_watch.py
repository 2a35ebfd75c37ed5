"""A main job as it runs, in the explorer (issue #38, "results as they land"): the Overview shows which study runs,
what is done and waiting and the time left; what has landed changes exactly when a study finishes (the moment the
page re-reads the results); the report and docs/findings.md of an unfinished job say it is partial. The
main_job.json files are written by the main job's own writer."""

from __future__ import annotations

import json
import time
from pathlib import Path

from app.explorer import jobs

APP = Path(__file__).resolve().parents[3] / "app" / "explorer"
NAMES = ["linearity", "prediction-gains", "senses", "intrinsic-dim"]


def _job(out: Path, done: dict, running=(), finished=False, stopped=None, now=None, jobs_n=1):
    """main_job.json as studies.job.main_job writes it: ``done`` study -> status, ``running`` for 125 s."""
    from studies.core.config import StudyConfig
    from studies.job.main_job import _write_job
    from studies.job.rows import JobRow, Status

    now = time.time() if now is None else now
    rows = [JobRow(n, Status(s), str(out / n), seconds=12.0, line=f"{n} line") for n, s in done.items()]
    out.mkdir(parents=True, exist_ok=True)
    _write_job(out, StudyConfig(model="m", corpus="c"), {}, rows, NAMES, now - 600, 5.0, finished=finished,
               running=list(running), since={n: now - 125 for n in running}, jobs=jobs_n, stopped=stopped,
               estimates={"senses": 420.0, "intrinsic-dim": 60.0, "prediction-gains": 30.0, "linearity": 20.0})


def test_progress_counts_and_time_left(tmp_path):
    from app.explorer.data import read_job_states

    now = time.time()
    _job(tmp_path / "smol", {"linearity": "ok"}, running=["senses"], now=now)
    (job,) = read_job_states(str(tmp_path))
    p = jobs.progress(job, now=now)
    assert p.active and p.run == "smol"
    assert (p.done, p.running, p.waiting) == (["linearity"], ["senses"], ["prediction-gains", "intrinsic-dim"])
    assert abs(p.left_s - (420 - 125 + 30 + 60)) < 1.0  # what senses has left, plus the two waiting
    assert "1 of 4 studies done" in jobs.headline(p, str) and "running senses" in jobs.headline(p, str)
    _job(tmp_path / "smol", {"linearity": "ok"}, running=["senses", "prediction-gains"], now=now, jobs_n=2)
    p = jobs.progress(read_job_states(str(tmp_path))[0], now=now)
    assert abs(p.left_s - (295 + 0 + 60) / 2) < 1.0  # two workers; prediction-gains past its estimate: 0 left
    stale = jobs.progress({**job, "updated_s": 900.0}, now=now)
    assert "main_job.json last written 900 ago" in jobs.headline(stale, lambda s: f"{s:.0f}")
    assert "last written" not in jobs.headline(p, str)
    _job(tmp_path / "smol", {"linearity": "ok", "senses": "ok"}, finished=True)
    p = jobs.progress(read_job_states(str(tmp_path))[0])
    assert p.state == "finished" and not p.active and p.left_s is None


def test_what_landed_changes_when_a_study_finishes_and_not_before(tmp_path):
    from app.explorer.data import read_job_states

    out = tmp_path / "smol"
    _job(out, {"linearity": "ok"}, running=["senses"])
    first = jobs.landed(read_job_states(str(tmp_path)))
    _job(out, {"linearity": "ok"}, running=["senses"])  # rewritten, nothing new finished
    assert jobs.landed(read_job_states(str(tmp_path))) == first
    _job(out, {"linearity": "ok"}, running=["senses", "prediction-gains"])  # another started: nothing to read yet
    assert jobs.landed(read_job_states(str(tmp_path))) == first
    _job(out, {"linearity": "ok", "senses": "failed"}, running=["prediction-gains"])
    assert jobs.landed(read_job_states(str(tmp_path))) != first
    assert ("smol", "senses", "failed") in jobs.landed(read_job_states(str(tmp_path)))


def test_overview_shows_the_running_job_before_any_result(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    _job(tmp_path / "results" / "smol", {}, running=["linearity"])
    monkeypatch.setenv("LENS_APP_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("LENS_APP_STORES", str(tmp_path / "stores"))
    at = AppTest.from_file(str(APP / "views" / "overview.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    info = [i.value for i in at.info]
    assert any(i.startswith("main job in `smol` running for 10 min: 0 of 4 studies done · running linearity · "
                            "3 waiting · about") for i in info), info
    assert any("show here as each study finishes" in i for i in info), info
    table = at.dataframe[0].value
    assert list(table["study"]) == NAMES and list(table["status"]) == ["running", "waiting", "waiting", "waiting"]
    # stopped by SIGTERM: nothing runs it any more; said once, no running panel
    _job(tmp_path / "results" / "smol", {"linearity": "ok"}, running=["senses"], stopped="stopped by SIGTERM at noon")
    at = AppTest.from_file(str(APP / "views" / "overview.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("ended before it finished (stopped by SIGTERM at noon); 1 of 4 studies done" in w.value
               for w in at.warning), [w.value for w in at.warning]
    assert not any("running for" in i.value for i in at.info)


def test_overview_and_sidebar_with_a_finished_study_beside_the_running_job(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.synthetic_runs import write_synthetic_run

    root = tmp_path / "results"
    write_synthetic_run(root / "live", n_layers=4, n_tokens=60, studies=("linearity",))
    _job(root / "live", {"linearity": "ok"}, running=["prediction-gains"])
    monkeypatch.setenv("LENS_APP_RESULTS", str(root))
    monkeypatch.setenv("LENS_APP_STORES", str(tmp_path / "stores"))
    at = AppTest.from_file(str(APP / "main.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(c.value.startswith("main job in `live` running for") for c in at.sidebar.caption), \
        [c.value for c in at.sidebar.caption]
    assert any("1 of 4 studies done" in i.value for i in at.info)
    assert any(s.value == "1 runs, 1 results" for s in at.subheader), [s.value for s in at.subheader]


def test_report_and_findings_mark_a_partial_job(tmp_path):
    from studies.reporting.findings import findings_for, read_run, render
    from studies.reporting.report import build_report

    out = tmp_path / "smol"
    _job(out, {"linearity": "n/a"}, running=["senses"])
    text = build_report(out).read_text()
    assert "Partial job: 1 of 4 studies done" in text and "still running" in text
    assert "Not in this report yet: prediction-gains, senses, intrinsic-dim" in text
    run = read_run(out)
    md = render([run], [str(out)], per_run=[findings_for(run)])
    assert "**Partial job: m**" in md and "not measured yet: prediction-gains, senses, intrinsic-dim" in md
    _job(out, {"linearity": "n/a"}, running=["senses"], stopped="stopped by SIGTERM at noon")
    assert "the job stopped before it finished (stopped by SIGTERM at noon)" in build_report(out).read_text()
    _job(out, {n: "n/a" for n in NAMES}, finished=True)
    assert "Partial job" not in build_report(out).read_text()
    assert json.loads((out / "main_job.json").read_text())["finished"]
