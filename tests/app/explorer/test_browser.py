"""The real explorer in a real browser: `lens app` on results from a tiny model, driven through
Playwright with Debian's Chromium (no browser download). Every page renders without an exception box;
the layer slider moves; a token picked on Nearest tokens gets its neighbour table; a screenshot per page
lands in a temporary folder (or $LENS_SCREENSHOTS)."""

from __future__ import annotations

import json
import os
import socket
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
PLOT, TABLE, TEXT = ".js-plotly-plot", '[data-testid="stDataFrame"]', '[data-testid="stTextArea"]'
PAGES = [  # url path, title (heading and sidebar link), what must render
    ("", "Overview", TABLE), ("tokens", "Token view", PLOT), ("nearest", "Nearest tokens", TABLE),
    ("prediction", "Prediction gains", PLOT),
    ("lenses", "Logit / tuned lens", PLOT), ("ablation", "Layer ablation", PLOT), ("geometry", "Geometry", PLOT),
    ("senses", "Senses", PLOT), ("probes", "Probes", PLOT), ("knobs", "Context knobs", PLOT), ("compare", "Compare", PLOT), ("live", "Live", TEXT),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(results_root, tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (scripts/system_deps.sh) to run the browser test")
    pytest.importorskip("playwright.sync_api")
    lens = Path(sys.executable).parent / "lens"
    # the server's output goes to a file: a pipe nobody reads stalls Streamlit once 64 kB are written
    log_path = tmp_path_factory.mktemp("app-log") / "lens-app.log"
    with running_app([str(lens), "app", "--results", str(results_root), "--stores", str(results_root / "tiny")],
                     log_path) as url:
        yield url


@contextmanager
def running_app(argv: list, log_path: Path, cwd=None, env=None):
    """``lens app`` (``argv`` without --port) on a free port, its output in ``log_path``; yields its URL once
    it answers /_stcore/health (90 s: Streamlit's imports take tens of seconds on a loaded machine), and
    ends it (and Streamlit, in its own session) afterwards."""
    port = _free_port()
    log_file = open(log_path, "wb")
    proc = subprocess.Popen([*argv, "--port", str(port)], cwd=cwd, env=env, stdout=log_file,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/_stcore/health", timeout=1)
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"lens app exited: {log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.3)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"lens app did not answer /_stcore/health within 90 s: {log_path.read_text(errors='replace')[-2000:]}")
    try:
        yield url
    finally:
        proc.terminate()  # `lens app` forwards it to Streamlit
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: takes Streamlit with it
        log_file.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    where = os.environ.get("LENS_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _settle(page, timeout=30_000):
    """Wait until Streamlit has finished running the page's script."""
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout)
    page.wait_for_timeout(300)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidgetRunningIcon\"]')", timeout=timeout)
    page.wait_for_timeout(200)


def test_every_page_in_chromium(server, shots):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        timings = {}
        try:
            page.goto(server, wait_until="domcontentloaded")
            for path, title, needs in PAGES:
                t0 = time.time()
                # through the sidebar, as a user would (one session, no reload)
                page.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).first.click()
                page.get_by_role("heading", name=title if path else "Lens Workbench").first.wait_for(timeout=30_000)
                _settle(page)
                page.wait_for_selector(needs, state="visible", timeout=30_000)
                if path == "tokens":
                    caption = page.get_by_text("at layer").first
                    before = caption.inner_text()
                    slider = page.locator('[data-testid="stSlider"] input[type="range"]').first
                    slider.focus()
                    slider.press("ArrowRight")
                    _settle(page)
                    page.wait_for_function(
                        "(b) => [...document.querySelectorAll('[data-testid=\"stCaptionContainer\"]')]"
                        ".some(e => e.innerText.includes('at layer') && e.innerText !== b)", arg=before, timeout=15_000)
                    page.wait_for_selector(".lens-tokens .tok", state="attached", timeout=15_000)
                    assert page.locator(".lens-tokens .tok").count() > 50  # the clickable strip (app.explorer.token_strip)
                if path == "nearest":  # pick another token: the query and its neighbour table follow
                    md = '[data-testid="stMarkdownContainer"]'
                    before = page.locator(md).filter(has_text="(row ").first.inner_text()
                    page.locator('[data-testid="stSelectbox"]').filter(has_text="token").first.click()
                    page.get_by_role("option").nth(3).click()
                    _settle(page)
                    page.wait_for_function(
                        "(b) => [...document.querySelectorAll('[data-testid=\"stMarkdownContainer\"]')]"
                        ".some(e => e.innerText.includes('(row ') && e.innerText !== b)", arg=before, timeout=15_000)
                    page.wait_for_selector(TABLE, state="visible", timeout=15_000)
                    page.locator('[data-testid="stCaptionContainer"]').filter(has_text="layer held on").first.wait_for(
                        timeout=15_000)
                if path == "senses":
                    slider = page.locator('[data-testid="stSlider"] input[type="range"]').first
                    slider.focus()
                    slider.press("ArrowLeft")
                    _settle(page)
                # Live's Run button (loading a model in the server) is exercised by test_pages.py's AppTest;
                # here it would double this test's time for no extra coverage of the browser side.
                assert page.locator('[data-testid="stException"]').count() == 0, f"exception on /{path}"
                page.screenshot(path=str(shots / f"{path or 'overview'}.png"), full_page=True)
                timings[path or "overview"] = round(time.time() - t0, 2)
        finally:
            browser.close()
            (shots / "timings.json").write_text(json.dumps(timings, indent=1))
    assert len(list(shots.glob("*.png"))) == len(PAGES), timings
