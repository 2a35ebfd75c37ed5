"""The explorer as the README opens it, in headless Chromium: `lens study all ... --out results`, then
`lens app --results results --stores stores` from the same folder. The Token view shows words (from the
run's store) for a study that saved no token text, and nearest tokens; tokens are clickable with an
instant hover card; a deep link reopens the same view in a new page; a download returns the result;
no request leaves 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from test_browser import ARGS, CHROMIUM, _settle, running_app

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]
# context-memory saves no token text (its words come from the store); logit-lens and linearity do
STUDIES = "linearity,logit-lens,context-memory"
NO_TEXT_METRIC = "context-memory.token_scores"
TOKENS = ".lens-tokens .tok"


@pytest.fixture(scope="module")
def readme_app(tmp_path_factory):
    """The README's commands in a fresh folder (a small run), and the explorer started on it there."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (scripts/system_deps.sh)")
    pytest.importorskip("playwright.sync_api")
    folder = tmp_path_factory.mktemp("readme")
    lens = str(Path(sys.executable).parent / "lens")
    repo = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "LENS_HTML_CDN": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)}
    job = subprocess.run([lens, "study", "all", "--model", "tiny-llama", "--max-tokens", "300", "--only", STUDIES,
                          "--out", "results"], cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stderr[-3000:]
    assert json.loads((folder / "results" / "linearity" / "result.json").read_text())["config"]["store"] == "results/store"
    with running_app([lens, "app", "--results", "results", "--stores", "stores"], folder / "lens-app.log",
                     cwd=folder, env=env) as url:
        yield url, folder


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def _open(browser, url, heading):
    """A new page (a new session) at ``url``, once the page's script has drawn it."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page.goto(url, wait_until="domcontentloaded")
    page.get_by_role("heading", name=heading).first.wait_for(timeout=60_000)
    _settle(page)
    return page


def _selected(page, label) -> str:
    """What the selectbox labelled ``label`` shows."""
    found = page.locator('[data-testid="stSelectbox"]').evaluate_all(
        "els => els.map(e => [e.innerText.trim(), (e.querySelector('input') || {}).value])")
    values = [v for text, v in found if text == label]
    assert values, found
    return values[0]


def _params(page) -> dict:
    return {k: v[0] for k, v in parse_qs(urlparse(page.url).query).items()}


def _wait_param(page, name, value, timeout=60_000):
    page.wait_for_function("([n, v]) => new URLSearchParams(location.search).get(n) === v", arg=[name, str(value)],
                           timeout=timeout)


def _no_exception(page):
    assert page.locator('[data-testid="stException"]').count() == 0, page.locator(
        '[data-testid="stException"]').first.inner_text()


def test_token_view_words_nearest_hover_and_click(readme_app, browser):
    url, _ = readme_app
    page = _open(browser, f"{url}/tokens?metric={NO_TEXT_METRIC}", "Token view")
    try:
        page.wait_for_selector(TOKENS, state="attached", timeout=90_000)
        _no_exception(page)
        assert "context memory per token (held-out R²) at layer" in page.get_by_text("at layer").first.inner_text()
        words = page.locator(TOKENS).evaluate_all("els => els.map(e => e.firstChild.textContent)")
        assert len(words) > 20
        assert not any(re.fullmatch(r"#\d+", w) for w in words), words[:20]  # words, not store rows
        assert sum(bool(re.search(r"[A-Za-z]{3}", w)) for w in words) > len(words) // 3, words[:20]
        assert page.get_by_text("was not found").count() == 0
        # nearest tokens: the store this run read, found from the results folder
        page.get_by_text("layer held on").first.wait_for(timeout=90_000)
        page.wait_for_selector('[data-testid="stDataFrame"]', state="attached", timeout=90_000)
        # hover: the card shows at once (CSS :hover), with the token, its context and the value at the layer
        tok = page.locator(TOKENS).nth(12)
        card = tok.locator(".card")
        assert card.evaluate("e => getComputedStyle(e).visibility") == "hidden"
        tok.hover()
        assert card.evaluate("e => getComputedStyle(e).visibility") == "visible"
        text = card.inner_text()
        assert "context memory per token (held-out R²) at layer" in text and "row " in text and "…" in text
        # click: that token is picked (the selectbox and the URL follow)
        pos = tok.get_attribute("data-pos")
        row = re.search(r"row (\d+)", text).group(1)
        tok.click()
        _wait_param(page, "token", row)
        _settle(page)
        assert page.locator(f'{TOKENS}.picked[data-pos="{pos}"]').count() == 1
        assert _selected(page, "token").startswith(f"{row}: ")
        _no_exception(page)
    finally:
        page.close()


def test_deep_link_reopens_the_same_view(readme_app, browser):
    url, _ = readme_app
    page = _open(browser, f"{url}/tokens?run=results&metric=logit-lens.token_rank&layer=1&token=50", "Token view")
    try:
        page.wait_for_selector(TOKENS, state="attached", timeout=90_000)
        caption = page.get_by_text("at layer").first.inner_text()
        assert caption.startswith("rank of the true token") and " at layer 1:" in caption
        assert _selected(page, "token").startswith("50: ")
        assert _selected(page, "metric").startswith("logit-lens: token_rank — results")
        # changing the view rewrites the URL
        slider = page.locator('[data-testid="stSlider"] input[type="range"]').first
        slider.focus()
        slider.press("ArrowRight")
        _wait_param(page, "layer", 2)
        _settle(page)
        linked = page.url
        assert _params(page) == {"run": "results", "metric": "logit-lens.token_rank", "layer": "2", "token": "50"}
        shown = page.get_by_text("at layer").first.inner_text()
        picked, metric = _selected(page, "token"), _selected(page, "metric")
    finally:
        page.close()
    again = _open(browser, linked, "Token view")  # a new page (a new session): the same view
    try:
        again.wait_for_selector(TOKENS, state="attached", timeout=90_000)
        assert again.get_by_text("at layer").first.inner_text() == shown
        assert (_selected(again, "token"), _selected(again, "metric")) == (picked, metric)
        _no_exception(again)
    finally:
        again.close()


def test_download_returns_the_result(readme_app, browser, tmp_path):
    url, folder = readme_app
    page = _open(browser, f"{url}/studies?run=results", "Studies")
    try:
        page.get_by_role("button", name="result.json").first.wait_for(timeout=90_000)
        study = _selected(page, "study")
        with page.expect_download(timeout=90_000) as got:
            page.get_by_role("button", name="result.json").first.click()
        path = tmp_path / "result.json"
        got.value.save_as(path)
        record = json.loads(path.read_text())
        assert study.startswith(record["study"] + " — ")
        assert path.read_bytes() == (folder / "results" / record["study"] / "result.json").read_bytes()
        with page.expect_download(timeout=90_000) as got:
            page.get_by_role("button", name="arrays (.npz)").first.click()
        got.value.save_as(tmp_path / "arrays.npz")
        with np.load(tmp_path / "arrays.npz", allow_pickle=False) as mine, \
                np.load(folder / "results" / record["study"] / "arrays.npz", allow_pickle=False) as saved:
            assert sorted(mine.files) == sorted(saved.files) and mine.files
            for k in saved.files:
                np.testing.assert_array_equal(mine[k], saved[k])
    finally:
        page.close()


def test_no_request_leaves_localhost(readme_app, browser):
    from test_browser import PAGES

    url, _ = readme_app
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    seen = []
    page.on("request", lambda r: seen.append(r.url))
    page.on("websocket", lambda ws: seen.append(ws.url))
    try:
        page.goto(url, wait_until="domcontentloaded")
        _settle(page)
        for path, title, _needs in PAGES:
            page.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).first.click()
            page.get_by_role("heading", name=title if path else "Lens Workbench").first.wait_for(timeout=60_000)
            _settle(page, timeout=90_000)
            if path == "tokens":  # the hover card too
                page.wait_for_selector(TOKENS, state="attached", timeout=90_000)
                page.locator(TOKENS).nth(3).hover()
        page.wait_for_timeout(1000)
    finally:
        page.close()
    local = re.compile(r"^(https?|wss?)://127\.0\.0\.1:\d+/|^(data|blob):")
    outside = [u for u in seen if not local.match(u)]
    assert len(seen) > 20
    assert outside == [], outside
