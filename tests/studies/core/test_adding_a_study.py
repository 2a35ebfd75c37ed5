"""Adding a study is one module and one registry line: the worked example of docs/adding_a_study.md,
registered as written there, runs in the main job and shows up in the report and the explorer, none of
which is touched."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "adding_a_study.md"
APP = ROOT / "app" / "explorer"


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The doc's module (first python block) importable, and its registry line (second) in the registry."""
    from studies.core import registry

    module_src, line = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)[:2]
    entry = ast.literal_eval("{" + line.strip() + "}")
    assert len(entry) == 1
    name, (module, description) = next(iter(entry.items()))
    assert module == "studies.update_alignment"
    folder = tmp_path_factory.mktemp("toy")
    (folder / "toy_update_alignment.py").write_text(module_src, encoding="utf-8")
    sys.path.insert(0, str(folder))
    registry.STUDIES[name] = ("toy_update_alignment", description)  # the line, pointing at the copy
    try:
        yield name
    finally:
        del registry.STUDIES[name]
        sys.path.remove(str(folder))
        sys.modules.pop("toy_update_alignment", None)


@pytest.fixture(scope="module")
def job(toy, tmp_path_factory):
    from app.commands.cli import main

    out = tmp_path_factory.mktemp("results") / "run"
    # --jobs 1: the studies run in this process, which holds the registry line the fixture added in memory;
    # spawned workers (two or more cores free) import the registry file afresh and would not know the study
    rc = main(["study", "all", "--model", "tiny-llama", "--max-tokens", "300", "--only", f"{toy},linearity",
               "--out", str(out), "--quiet", "--jobs", "1"])
    return rc, out


def test_the_main_job_runs_it_on_the_shared_store(toy, job):
    from studies.reporting.results import read_result

    rc, out = job
    assert rc == 0
    rows = {r["study"]: r for r in json.loads((out / "main_job.json").read_text())["studies"]}
    assert rows[toy]["status"] == "ok" and "lowest update alignment" in rows[toy]["line"]
    rec = read_result(out / toy)
    assert rec.config["store"] == str(out / "store")  # what it declared was in the one shared capture
    assert rec.layers == [0, 1, 2] and len(rec.metrics["alignment"]) == 3
    assert rec.arrays()["token_alignment"].shape == (3, rec.n_tokens)
    assert {"main"} == set(rec.figures())


def test_the_report_shows_its_figure_and_headline(toy, job):
    _, out = job
    html = (out / "report.html").read_text(encoding="utf-8")
    assert f"data-figure='{toy}/main'" in html
    assert "lowest update alignment" in html and "blocks partly erase" in html


def _page(name, results, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("LENS_APP_RESULTS", str(results))
    monkeypatch.setenv("LENS_APP_STORES", str(results))
    at = AppTest.from_file(str(APP / "views" / f"{name}.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_explorer_shows_it(toy, job, monkeypatch):
    _, out = job
    results = out.parent
    heads = _page("overview", results, monkeypatch).dataframe[2].value  # after the judged findings
    assert "lowest update alignment" in set(heads["measure"])
    at = _page("studies", results, monkeypatch)
    at.selectbox(key="st-study").set_value(toy).run()
    assert not at.exception
    declared = at.dataframe[0].value
    assert {"alignment", "token_alignment", "min_alignment"} <= set(declared["name"])
    assert at.get("plotly_chart")
    labels = _page("tokens", results, monkeypatch).selectbox(key="tok-metric").options
    assert any(o.startswith(f"{toy}: token_alignment") for o in labels)
