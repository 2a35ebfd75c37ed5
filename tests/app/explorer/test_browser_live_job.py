"""The explorer opened while a main job runs (issue #38): in headless Chromium the Overview shows the job running
(which study, done / waiting, time left) and its first result; when the next study finishes its result appears
and the job's panel goes away — with no reload of the page (a mark set in the page survives) and no click on
"Reload results". The job is a real one on tiny-llama (tests/app/explorer/live_job_driver.py), its second study
held until the test has seen the first result, so the test does not race the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_browser import ARGS, CHROMIUM, _settle, running_app

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
STUDIES = "linearity,prediction-gains"
DRIVER = Path(__file__).resolve().parent / "live_job_driver.py"
REPO = Path(__file__).resolve().parents[3]


def _wait_for(check, what: str, timeout: float, job=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        if job is not None and job.poll() is not None and job.returncode != 0:
            pytest.fail(f"the job exited {job.returncode} while waiting for {what}")
        time.sleep(0.2)
    pytest.fail(f"no {what} within {timeout} s")


def _job_rows(out: Path) -> dict:
    try:
        return {r["study"]: r["status"] for r in json.loads((out / "main_job.json").read_text())["studies"]}
    except (OSError, ValueError, KeyError):
        return {}


def test_overview_shows_the_running_job_and_results_as_they_land(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (scripts/system_deps.sh)")
    pytest.importorskip("playwright.sync_api")
    from playwright.sync_api import sync_playwright

    results, go = tmp_path / "results", tmp_path / "go"
    out = results / "job"
    env = {**os.environ, "LENS_HTML_CDN": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    lens = str(Path(sys.executable).parent / "lens")
    with open(tmp_path / "job.log", "wb") as log, \
            running_app([lens, "app", "--results", str(results), "--stores", str(tmp_path / "stores")],
                        tmp_path / "lens-app.log", env=env) as url:
        job = subprocess.Popen([sys.executable, str(DRIVER), str(out), str(go), STUDIES], cwd=REPO, env=env,
                               stdout=log, stderr=subprocess.STDOUT)
        try:
            # opened once the first study has landed and the second runs (the held one)
            _wait_for(lambda: list(_job_rows(out).values()) in (["ok", "running"], ["running", "ok"]),
                      "first result with the second study running", 150, job)
            first = next(s for s, v in _job_rows(out).items() if v == "ok")
            second = next(s for s, v in _job_rows(out).items() if v == "running")
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
                try:
                    page = browser.new_page(viewport={"width": 1400, "height": 1000})
                    page.goto(url, wait_until="domcontentloaded")
                    page.get_by_role("heading", name="Lens Workbench").first.wait_for(timeout=60_000)
                    _settle(page, timeout=60_000)
                    page.evaluate("() => { window.__lensMark = 1; }")  # gone if the page were reloaded
                    # (the run's name is markdown code: the text reads "main job in job running for ...")
                    info = page.locator('[data-testid="stAlertContentInfo"]').filter(has_text="main job in job running for")
                    info.first.wait_for(timeout=30_000)
                    text = info.first.inner_text()
                    assert f"1 of 2 studies done · running {second} · about" in text, text
                    page.get_by_text("1 runs, 1 results").first.wait_for(timeout=30_000)
                    sidebar = page.locator('[data-testid="stSidebar"]').get_by_text("main job in job running for")
                    sidebar.first.wait_for(timeout=30_000)
                    page.screenshot(path=str(tmp_path / "running.png"), full_page=True)
                    assert page.locator('[data-testid="stException"]').count() == 0

                    go.touch()  # the held study runs; its result must show without a reload
                    page.get_by_text("1 runs, 2 results").first.wait_for(timeout=120_000)
                    page.wait_for_function("() => !document.body.innerText.includes('main job in job running')",
                                           timeout=30_000)
                    assert page.evaluate("() => window.__lensMark") == 1
                    assert page.locator('[data-testid="stException"]').count() == 0
                    page.screenshot(path=str(tmp_path / "finished.png"), full_page=True)
                finally:
                    browser.close()
            assert job.wait(timeout=120) == 0, (tmp_path / "job.log").read_text(errors="replace")[-3000:]
            assert set(_job_rows(out).values()) == {"ok"}
        finally:
            go.touch()
            if job.poll() is None:
                job.terminate()
                job.wait(timeout=30)
