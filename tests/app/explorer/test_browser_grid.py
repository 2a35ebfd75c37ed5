"""The logit-lens grid in a real browser (the server and Chromium of test_browser.py): it renders for a
corpus result, a cell's hover shows the top-k with probabilities, and a click opens the Token view at
that token and layer (a deep link through st.query_params, app/explorer/links.py)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

from app.explorer import grid
from studies.reporting.results import read_result
from test_browser import ARGS, CHROMIUM, _settle, server, shots  # noqa: F401  (server, shots: fixtures)

pytestmark = pytest.mark.browser


def _selectbox_shows(page, want: str) -> None:
    """Wait until a selectbox shows ``want`` (as its text, or as its input's value or label)."""
    page.wait_for_function(
        "(want) => [...document.querySelectorAll('[data-testid=\"stSelectbox\"]')].some(e => "
        "e.innerText.includes(want) || [...e.querySelectorAll('input')].some(i => (i.value || '').includes(want)"
        " || (i.getAttribute('aria-label') || '').includes(want)))", arg=want, timeout=15_000)


def test_lens_grid_renders_and_a_click_opens_the_token_view_at_that_cell(server, shots, results_root):  # noqa: F811
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        try:
            page.goto(server + "/lenses", wait_until="domcontentloaded")
            page.get_by_role("heading", name="Logit / tuned lens").first.wait_for(timeout=60_000)
            _settle(page)
            page.wait_for_selector("table.lens-grid a", state="visible", timeout=60_000)
            cells = page.locator("table.lens-grid a")
            layers = sorted({int(cells.nth(i).get_attribute("data-layer")) for i in range(cells.count())})
            assert len(layers) >= 2 and cells.count() >= 2 * len(layers)
            cell = page.locator(f"table.lens-grid a[data-layer='{layers[1]}']").nth(4)
            layer, row = int(cell.get_attribute("data-layer")), int(cell.get_attribute("data-row"))
            assert cell.inner_text().strip()  # the top-1 token
            cell.hover()
            tip = page.locator("table.lens-grid td:hover .tip")
            tip.wait_for(state="visible", timeout=5_000)
            tip_text = tip.inner_text()
            assert f"layer {layer}" in tip_text and "0.400" in tip_text  # top-k, probabilities
            page.screenshot(path=str(shots / "lens-grid.png"), full_page=True)
            # the colour switch above the grid repaints it in the page: no script rerun, links follow
            first = cell.evaluate("a => a.style.background")
            page.locator(".lens-grid-colours label").filter(has_text="entropy of the lens").click()
            page.wait_for_function("() => document.querySelector('table.lens-grid').dataset.colour === 'entropy'",
                                   timeout=5_000)
            assert "metric=logit-lens.token_entropy" in cell.get_attribute("href")
            assert "entropy of the lens" in page.locator(".lens-grid-legend").inner_text()
            page.locator(".lens-grid-colours label").filter(has_text="cross-entropy").click()
            page.wait_for_function("() => document.querySelector('table.lens-grid').dataset.colour === 'ce'",
                                   timeout=5_000)
            assert cell.evaluate("a => a.style.background") == first
            assert page.locator('[data-testid="stException"]').count() == 0

            cell.click()
            page.wait_for_url("**/tokens?**", timeout=30_000)
            query = {k: v[0] for k, v in parse_qs(urlparse(page.url).query).items()}
            assert (int(query["layer"]), int(query["token"])) == (layer, row) and query["metric"] == "logit-lens.token_ce"
            # the page made the hover from the same parts as app/explorer/grid.py's Grid.hover: the same text
            rec = read_result(results_root / query["run"] / "logit-lens")
            win = grid.windows(rec.arrays())[0]
            g = grid.build_grid(rec.arrays(), rec.layers, colour="ce", start=win["start"], stop=win["start"] + 40)
            expected = g.hover[g.layers.index(layer), list(g.rows).index(row)]
            assert tip_text.strip() == expected.strip()
            page.get_by_role("heading", name="Token view").first.wait_for(timeout=60_000)
            _settle(page)
            page.get_by_text(f"at layer {layer}:").first.wait_for(timeout=30_000)  # the layer of the cell
            assert "cross-entropy" in page.get_by_text(f"at layer {layer}:").first.inner_text()
            _selectbox_shows(page, f"{row}: ")  # the token of the cell, picked
            _selectbox_shows(page, "logit-lens: token_ce")  # the metric of the cell's colour, of its run
            _selectbox_shows(page, f"— {query['run'].split('/')[0]} · ")
            assert page.locator('[data-testid="stException"]').count() == 0
            page.screenshot(path=str(shots / "lens-grid-token-view.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(shots / "lens-grid-failed.png"), full_page=True)
            raise
        finally:
            browser.close()
