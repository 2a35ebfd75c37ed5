"""`lens study all` end to end on tiny-llama: one shared store, a results folder per study, report.html
with every figure; a failing study is recorded, the rest still run, and the job exits non-zero. The
job runs on two worker processes (studies.job.pool), the failing one in this process (--jobs 1:
the planted failure is a monkeypatch, which a spawned worker would not see)."""

from __future__ import annotations

import json
import re

import pytest

from app.commands.cli import main

ONLY = "prediction-gains,linearity"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("main_job")
    rc = main(["study", "all", "--model", "tiny-llama", "--max-tokens", "300", "--only", ONLY,
               "--out", str(out), "--quiet", "--jobs", "2"])
    return rc, out


def test_all_writes_results_and_report(job):
    rc, out = job
    assert rc == 0
    assert (out / "store" / "manifest.json").is_file()
    for study in ONLY.split(","):
        rec = json.loads((out / study / "result.json").read_text())
        assert rec["config"]["store"] == str(out / "store")  # captured once, reused
    html = (out / "report.html").read_text()
    figures = re.findall(r"data-figure='([^']+)'", html)
    assert "prediction-gains/main" in figures and "linearity/main" in figures
    assert html.count("Plotly.newPlot") == 1  # one loop over the figures
    assert html.count("<script type=\"text/javascript\">") == 1  # plotly.js inlined once (offline)
    assert "<script src=" not in html  # nothing fetched from the network
    assert "−0.983 … −0.997" in html and "Pearson r" in html and "≈ 0.99" in html
    assert "git revision" in html and "main job wall time" in html and "tiny-llama" in html
    job_json = json.loads((out / "main_job.json").read_text())
    assert [r["status"] for r in job_json["studies"]] == ["ok", "ok"]
    assert [r["study"] for r in job_json["studies"]] == ONLY.split(",")  # registry order, however they finished
    assert job_json["jobs"] == 2


def test_report_rebuilds(job, capsys):
    rc, out = job
    (out / "report.html").unlink()
    assert main(["report", str(out)]) == 0
    assert (out / "report.html").is_file()
    assert "report.html" in capsys.readouterr().out


def test_failing_study_is_recorded_and_exits_nonzero(job, monkeypatch):
    import dataclasses

    import studies.core.registry as registry

    rc, out = job
    real = registry.get_study

    def broken(config, inputs):
        raise RuntimeError("planted failure")

    monkeypatch.setattr(registry, "get_study", lambda name: dataclasses.replace(real(name), compute=broken)
                        if name == "linearity" else real(name))
    mtime = (out / "store" / "manifest.json").stat().st_mtime
    rc = main(["study", "all", "--model", "tiny-llama", "--max-tokens", "300", "--only", ONLY,
               "--out", str(out), "--quiet", "--jobs", "1"])
    assert rc == 1
    assert (out / "store" / "manifest.json").stat().st_mtime == mtime  # the store was reused
    rows = {r["study"]: r for r in json.loads((out / "main_job.json").read_text())["studies"]}
    assert rows["prediction-gains"]["status"] == "ok"
    assert rows["linearity"]["status"] == "failed" and "planted failure" in rows["linearity"]["error"]
    assert "planted failure" in (out / "report.html").read_text()


def test_bad_only_and_param_exit_2(tmp_path, capsys):
    assert main(["study", "all", "--model", "tiny-llama", "--only", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown studies nope" in capsys.readouterr().err
    assert main(["study", "all", "--model", "tiny-llama", "--only", "linearity", "--param", "bogus=1",
                 "--out", str(tmp_path)]) == 2
    assert "bogus" in capsys.readouterr().err
    assert main(["study", "all", "--model", "tiny-llama", "--only", "linearity", "--jobs", "-1",
                 "--out", str(tmp_path)]) == 2
    assert "--jobs: expected a positive number or 'auto', got -1" in capsys.readouterr().err


def test_a_row_is_written_as_main_job_json_has_always_held_it():
    """The explorer and the report read main_job.json: the row dataclass writes the same keys in the same
    order, the status as its plain string, ``resumed`` only when true."""
    from studies.job.rows import JobRow, Status

    assert [s.value for s in Status] == ["ok", "n/a", "failed", "running", "waiting"]
    row = JobRow("linearity", Status.NOT_APPLICABLE, "out/linearity", seconds=1.5, line="not applicable: x",
                 error="x", halt=["input", "never written"])
    written = json.dumps(row.to_json())
    assert written == ('{"study": "linearity", "status": "n/a", "seconds": 1.5, "out": "out/linearity", '
                       '"line": "not applicable: x", "error": "x"}')
    kept = JobRow("linearity", Status.OK, "o", seconds=2.0, line="l", resumed=True).to_json()
    assert list(kept) == ["study", "status", "seconds", "out", "line", "error", "resumed"] and kept["resumed"] is True
    waiting = JobRow("linearity", Status.WAITING, "o", estimate_s=60.0).to_json()
    assert list(waiting) == ["study", "status", "seconds", "out", "line", "error", "started", "estimate_s"]
    assert (waiting["status"], waiting["started"], waiting["estimate_s"]) == ("waiting", None, 60.0)
    assert list(JobRow("linearity", Status.OK, "o", started=1.0, estimate_s=60.0).to_json())[-1] == "error"
    assert f"{Status.FAILED:<7}|" == "failed |"  # the CLI's table pads the status as it padded the string


def test_a_second_job_on_the_same_results_folder_is_refused(tmp_path, capsys, monkeypatch):
    """One main job per results folder: while one holds it (here this process, as another job would), a
    second is refused with exit 2 naming the holder, before it writes anything there."""
    import os

    from lens.store.lock import LOCK, WriterLock

    monkeypatch.delenv("LENS_DEBUG", raising=False)
    out = tmp_path / "job"
    out.mkdir()
    (out / "main_job.json").write_text('{"the": "first job\'s"}')
    with WriterLock(out, work="main job"):
        rc = main(["study", "all", "--model", "tiny-llama", "--max-tokens", "200", "--only", "linearity", "--quiet",
                   "--out", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert f"job is being written by pid {os.getpid()}" in err[0] and "wait for that main job to finish" in err[0]
    assert sorted(p.name for p in out.iterdir()) == ["main_job.json"]  # untouched; the lock left with its holder
    assert (out / "main_job.json").read_text() == '{"the": "first job\'s"}' and not (out / LOCK).exists()


def test_a_study_refused_for_its_input_is_one_line_not_a_traceback(tmp_path, caplog, monkeypatch):
    """A corpus too small for a study: the job goes on, and the log says why in one line (a traceback only
    for a failure that is not the input's, or with LENS_DEBUG)."""
    import logging

    from studies.job.main_job import StudiesFailed, run_all

    monkeypatch.delenv("LENS_DEBUG", raising=False)
    corpus = tmp_path / "short.txt"
    corpus.write_text("word " * 30)
    base = {"model": "tiny-llama", "corpus": str(corpus), "max_tokens": 200, "seq_len": 128, "batch_size": 8,
            "device": "cpu", "store": None, "seed": 0, "progress": False}
    with caplog.at_level(logging.ERROR, logger="studies.job.main_job"), pytest.raises(StudiesFailed) as failed:
        run_all(base, tmp_path / "job", only="linearity,senses", progress=False, jobs=1)
    assert [r["study"] for r in failed.value.rows if r["status"] == "failed"] == ["linearity"]
    (record,) = [r for r in caplog.records if "linearity" in r.getMessage()]
    assert record.getMessage().startswith("study linearity failed: linearity: linearity needs more tokens than d_model")
    assert record.exc_info is None
