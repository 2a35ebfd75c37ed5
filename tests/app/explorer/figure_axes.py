"""What a reader sees on each axis of a saved figure: plotly.js (the package's own copy, offline) draws the figure
in headless Chromium, and for every axis a visible trace sits on we read back its title and the tick labels it
drew (``_fullLayout``'s computed ticks) — the labels a log axis over a narrow range, or an axis of one value,
fails to draw, which the figure's JSON alone does not say."""

from __future__ import annotations

import json

CHROMIUM = "/usr/bin/chromium"
SIZE = {"width": 1000, "height": 650}  # a figure's own size when it sets one; else what the explorer gives it

_READ = """async ([fig, size]) => {
    const div = document.getElementById('fig');
    Plotly.purge(div);
    await Plotly.newPlot(div, fig.data || [], {...(fig.layout || {}), ...size}, {staticPlot: true});
    const fl = div._fullLayout, seen = new Set(), out = [];
    for (const t of div._fullData) {
        if (t.visible !== true || t.xaxis === undefined) continue;  // not on cartesian axes (a table, a pie)
        for (const id of [t.xaxis, t.yaxis]) {
            if (seen.has(id)) continue;
            seen.add(id);
            const ax = fl[id.charAt(0) + 'axis' + id.slice(1)];
            if (!ax || ax.visible === false) continue;
            const labels = ax.showticklabels === false ? [] :
                (ax._vals || []).map(v => String(v.text || '').replace(/<[^>]*>/g, '').trim()).filter(s => s);
            let title = ((ax.title || {}).text || '').trim();
            if (title === (fl._dfltTitle || {})[id.charAt(0)]) title = '';  // plotly's "Click to enter ..." placeholder
            out.push({axis: id, title: title, labels: labels, type: ax.type});
        }
    }
    return out;
}"""


def read_axes(figures: dict[str, dict]) -> dict[str, list[dict]]:
    """name -> [{axis, title, labels, type}] for each figure ({data, layout}, as figures/*.json holds it)."""
    import plotly.offline
    from playwright.sync_api import sync_playwright

    page_html = ("<html><body style='margin:0'><div id='fig'></div>"
                 f"<script>{plotly.offline.get_plotlyjs()}</script></body></html>")
    out = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"], headless=True)
        try:
            page = browser.new_page()
            page.route("**/*", lambda route: route.abort())  # nothing leaves the machine
            page.set_content(page_html)
            for name, fig in figures.items():
                layout = fig.get("layout", {})
                size = {"width": layout.get("width") or SIZE["width"], "height": layout.get("height") or SIZE["height"]}
                out[name] = page.evaluate(_READ, [json.loads(json.dumps(fig)), size])
        finally:
            browser.close()
    return out


def unreadable(axes: list[dict]) -> list[str]:
    """What is wrong with a figure's axes: each axis without a title, or with fewer than two tick labels."""
    bad = []
    for a in axes:
        if not a["title"]:
            bad.append(f"{a['axis']} has no title")
        if len(set(a["labels"])) < 2:
            bad.append(f"{a['axis']} ({a['type']}{', ' + repr(a['title']) if a['title'] else ''}) has "
                       f"{len(set(a['labels']))} tick label(s): {a['labels']}")
    return bad
