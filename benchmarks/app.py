"""Explorer responsiveness: first render of every page and a layer-slider move, on results sized like a
100k-token SmolLM2 run (30 layers, d_model 576; synthetic folders with every study's keys, see
tests/synthetic_runs.py — a real 100k-token main job takes far longer than this benchmark should).

Goals: first render < 2 s per page, slider move < 0.3 s. Timings are `streamlit.testing` runs (the
script's own time, no browser), median of ``--repeat`` runs, the cache cleared before each first render.

``--browser``: the same in headless Chromium against a real `lens app` (``--results DIR``: any results
root, e.g. the demo's `results`; default the synthetic one): each page's first paint (a new page at its
URL until its script has drawn it: heading shown, no script running) in a fresh browser profile
(cold: the app's JavaScript fetched and compiled again) and in a profile that has opened the app once
(warm), each beside a bare Streamlit app (a title and a line) served and painted the same way in the same
run, the floor of any Streamlit page on this machine (the ratio cold / bare is printed); in the Token view, a
layer move and a token click (until the view and the URL follow); on the Logit lens page, the grid's colour
switch, window change and positions change (until the new grid is drawn), beside the bare app's selectbox
redrawing a table. An interaction is timed in the page's own clock, from the input event (pointerdown /
keydown) to the first frame where it is drawn and no script runs — what the user waits — and, beside it, as
the driver's wall time (which adds Playwright's own checks before it clicks: an option of a list that is
still opening waits until the list stops moving). Each interaction part starts once the machine is idle
again (the closed tabs of the part before are torn down for seconds). Plain seconds, median of
``--repeat``, the load average printed: on a busy machine the seconds say little. ``--only paint tokens
grid`` picks the parts, ``--pages`` the pages painted.

    .venv/bin/python benchmarks/app.py [--tokens 100000] [--layers 30] [--repeat 3] [--keep DIR]
    .venv/bin/python benchmarks/app.py --browser [--results results] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PAGES = ["overview", "tokens", "prediction", "lenses", "ablation", "geometry", "senses", "knobs", "compare", "studies", "live"]
# (page, slider key, the tab it is in: a page's tabs are built only while open, app.explorer.ui.tabs)
SLIDERS = [("tokens", "tok-layer", None), ("geometry", "an-layer", "anisotropy & rogue dims"), ("senses", "se-layer", None)]
FIRST_RENDER_GOAL_S, SLIDER_GOAL_S = 2.0, 0.3
VIEWPORT = {"width": 1400, "height": 1000}
BROWSER_PARTS = ("paint", "tokens", "grid")  # first paint of every page, Token view moves, lens grid


def _app(page):
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(ROOT / "app" / "explorer" / "views" / f"{page}.py"), default_timeout=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", default=None, help="write the synthetic results here and keep them")
    parser.add_argument("--browser", action="store_true", help="first paint and interactions in headless Chromium")
    parser.add_argument("--results", default=None, help="--browser: a results root to open (default: synthetic)")
    parser.add_argument("--only", nargs="+", choices=BROWSER_PARTS, default=list(BROWSER_PARTS),
                        help="--browser: which parts to time (default: all)")
    parser.add_argument("--pages", nargs="+", default=None, metavar="PAGE",
                        help="--browser: first paint of these pages only (file names in app/explorer/views, 'overview' too)")
    args = parser.parse_args(argv)
    if args.browser and args.results:
        return browser_bench(Path(args.results), args.repeat, args.only, args.pages)

    os.environ["LENS_HTML_CDN"] = "1"
    os.environ.setdefault("STREAMLIT_LOGGER_LEVEL", "error")
    import streamlit as st

    from tests.synthetic_runs import write_synthetic_run

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="lens-app-bench-"))
    t0 = time.perf_counter()
    if not (root / "smol-100k" / "linearity" / "result.json").is_file():
        write_synthetic_run(root / "smol-100k", model="smollm2-135m-synthetic", n_layers=args.layers,
                            n_tokens=args.tokens, d_model=576, topk_tokens=2000)
    print(f"results: {root} ({args.tokens} tokens x {args.layers} layers; written in {time.perf_counter() - t0:.1f} s)")
    if args.browser:
        return browser_bench(root, args.repeat, args.only, args.pages)
    os.environ["LENS_APP_RESULTS"] = str(root)
    os.environ["LENS_APP_STORES"] = str(root)
    _app("senses").run()  # import streamlit, plotly, numpy once: not part of any page's render
    print(f"load average before: {_load()} ({os.cpu_count()} cores)")

    print(f"\n{'page':<12}{'first render (s)':>18}{'rerun (s)':>12}   goal < {FIRST_RENDER_GOAL_S} s")
    worst = 0.0
    for page in PAGES:
        firsts, reruns = [], []
        for _ in range(args.repeat):
            st.cache_data.clear()
            st.cache_resource.clear()
            at = _app(page)
            t = time.perf_counter()
            at.run()
            firsts.append(time.perf_counter() - t)
            t = time.perf_counter()
            at.run()
            reruns.append(time.perf_counter() - t)
            if at.exception:
                raise SystemExit(f"{page}: {at.exception[0].value}")
        first = statistics.median(firsts)
        worst = max(worst, first)
        print(f"{page:<12}{first:>18.3f}{statistics.median(reruns):>12.3f}   {'ok' if first < FIRST_RENDER_GOAL_S else 'SLOW'}")

    print(f"\n{'slider':<22}{'move (s)':>10}   goal < {SLIDER_GOAL_S} s")
    worst_move = 0.0
    for page, key, tab in SLIDERS:
        at = _app(page)
        if tab:
            at.session_state[f"{page}-tab"] = tab
        at.run()
        options = [int(o) for o in at.select_slider(key=key).options]
        moves = []
        for i in range(args.repeat):
            value = options[i % len(options)]
            t = time.perf_counter()
            at.select_slider(key=key).set_value(value).run()
            moves.append(time.perf_counter() - t)
        move = statistics.median(moves)
        worst_move = max(worst_move, move)
        print(f"{page + ':' + key:<22}{move:>10.3f}   {'ok' if move < SLIDER_GOAL_S else 'SLOW'}")
    print(f"\nworst first render {worst:.3f} s (goal {FIRST_RENDER_GOAL_S}), "
          f"worst slider move {worst_move:.3f} s (goal {SLIDER_GOAL_S})")
    print(f"load average after: {_load()}")
    return 0


CHROMIUM = "/usr/bin/chromium"


# the baseline app: a title and a line (first paint), and a fragment whose selectbox redraws a small table
# (the least a grid window change can cost: one fragment rerun and one table drawn)
BARE_APP = """import streamlit as st
st.title("Bare Streamlit")
st.write("one line")


@st.fragment
def part():
    v = st.selectbox("document / window", range(10), key="w")
    st.html(f"<table class=lens-grid><tr><td><a>{v}</a></td></tr></table>")


part()
"""


def _serve(cmd: list[str], log: Path, port_flag: str = "--port"):
    """(url, process) of a Streamlit server started on a free local port (``port_flag``), its output in ``log``."""
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd + [port_flag, str(port)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return f"http://127.0.0.1:{port}", proc


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _idle_share(seconds: float = 1.0) -> float:
    """The share of CPU time idle over the next ``seconds`` (all cores, /proc/stat); 1.0 where unreadable."""
    def read():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)  # idle + iowait, total
    try:
        i0, t0 = read()
        time.sleep(seconds)
        i1, t1 = read()
    except OSError:
        return 1.0
    return (i1 - i0) / max(t1 - t0, 1)


def _settle(what: str, idle: float = 0.8, limit_s: float = 60.0) -> None:
    """Wait (at most ``limit_s``) until the machine is idle again before timing ``what``: the closed tabs and
    sessions of the part before it are still being torn down for seconds on 2 cores, and the interactions
    timed next would pay for it."""
    t = time.perf_counter()
    share = _idle_share()
    while share < idle and time.perf_counter() - t < limit_s:
        share = _idle_share()
    print(f"\n({what}: waited {time.perf_counter() - t:.0f} s for the machine to settle, {share:.0%} idle; "
          f"load average {_load()})")


def browser_bench(root: Path, repeat: int, only=BROWSER_PARTS, names=None) -> int:
    """First paint of every page and Token-view interactions in headless Chromium (see the docstring)."""
    import ast
    import signal
    import subprocess
    import urllib.request

    from playwright.sync_api import sync_playwright

    tree = ast.parse((ROOT / "app" / "explorer" / "main.py").read_text(encoding="utf-8"))
    pages = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", "") == "PAGES")
    pages = [("" if f == "overview.py" else f[:-3], "Lens Workbench" if f == "overview.py" else t) for f, t in pages]
    if names:
        unknown = set(names) - {p or "overview" for p, _ in pages}
        if unknown:
            raise SystemExit(f"--pages: no such page {', '.join(sorted(unknown))}; the pages: "
                             f"{', '.join(p or 'overview' for p, _ in pages)}")
        pages = [(p, t) for p, t in pages if (p or "overview") in names]
    lens = Path(sys.executable).parent / "lens"
    logs = Path(tempfile.mkdtemp(prefix="lens-app-bench-log-"))
    # the baseline, served side by side: a bare Streamlit app (a title and a line), the floor of any page
    bare = logs / "bare_app.py"
    bare.write_text(BARE_APP, encoding="utf-8")
    servers = [_serve([str(lens), "app", "--results", str(root), "--stores", str(root)], logs / "app.log"),
               _serve([sys.executable, "-m", "streamlit", "run", str(bare), "--server.headless", "true",
                       "--browser.gatherUsageStats", "false", "--server.address", "127.0.0.1"], logs / "bare.log",
                      "--server.port")]
    (url, _), (bare_url, _) = servers
    print(f"load average before: {_load()} ({os.cpu_count()} cores)")
    try:
        for base, _proc in servers:
            for _ in range(600):
                try:
                    urllib.request.urlopen(base + "/_stcore/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.2)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])

            def paint(path, heading, context=None, base=None):
                """A new tab at the page's URL, until its script has drawn it; ``context``: a browser
                profile whose cache already holds the app's assets (else a fresh one: nothing cached)."""
                page = context.new_page() if context else browser.new_page(viewport=VIEWPORT)
                t = time.perf_counter()
                page.goto(f"{base or url}/{path}", wait_until="domcontentloaded")
                page.get_by_role("heading", name=heading).first.wait_for(timeout=120_000)
                page.wait_for_function(_IDLE, timeout=120_000)
                return page, time.perf_counter() - t

            paint("", "Lens Workbench")[0].close()  # the server's imports and first reads: not a page's paint
            paint("", "Bare Streamlit", base=bare_url)[0].close()
            # cold: a new browser profile per tab (the app's JavaScript fetched and compiled each time);
            # warm: tabs of one profile that has opened the app once (a researcher's second page)
            warm, warm_bare = browser.new_context(viewport=VIEWPORT), browser.new_context(viewport=VIEWPORT)
            paint("", "Lens Workbench", warm)[0].close()
            paint("", "Bare Streamlit", warm_bare, bare_url)[0].close()
            if "paint" in only:
                print(f"\n{'page':<12}{'first paint, cold (s)':>22}{'warm (s)':>10}{'cold / bare':>13}"
                      f"   goal < {FIRST_RENDER_GOAL_S} s")
            for path, heading in pages if "paint" in only else []:
                times = {"cold": [], "warm": [], "bare": [], "bare warm": []}
                for _ in range(repeat):
                    for kind, ctx, page_path, head, base in (
                            ("cold", None, path, heading, url), ("warm", warm, path, heading, url),
                            ("bare", None, "", "Bare Streamlit", bare_url),
                            ("bare warm", warm_bare, "", "Bare Streamlit", bare_url)):
                        page, seconds = paint(page_path, head, ctx, base)
                        times[kind].append(seconds)
                        page.close()
                med = {k: statistics.median(v) for k, v in times.items()}
                print(f"{path or 'overview':<12}{med['cold']:>22.3f}{med['warm']:>10.3f}{med['cold'] / med['bare']:>13.2f}"
                      f"   (bare Streamlit app beside it: {med['bare']:.3f} cold, {med['bare warm']:.3f} warm)")

            if "tokens" in only:
                _settle("Token view")
                _print_interactions("Token view", _token_interactions(paint, repeat))
            if "grid" in only:
                _settle("lens grid")
            grid_times = _grid_interactions(paint, repeat) if "grid" in only else {}
            if grid_times:
                bare_times = _grid_interactions(lambda path, heading: paint("", "Bare Streamlit", base=bare_url),
                                                repeat, bare=True)
                grid_times["bare Streamlit: selectbox → table"] = bare_times["window change"]
                _print_interactions("Logit lens grid", grid_times)
            elif "grid" in only:
                print("\nLogit lens grid: no grid in these results (no logit-lens result with per-token top-k)")
            browser.close()
    finally:
        for _, proc in servers:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    print(f"\nload average after: {_load()}")
    return 0


_IDLE = "() => !document.querySelector('[data-testid=\"stStatusWidgetRunningIcon\"]')"
# the user's input, stamped in the page's clock: the first pointerdown or keydown after arming
_ARM = """() => {
  window.__benchT0 = null;
  const mark = () => { if (window.__benchT0 === null) window.__benchT0 = performance.now(); };
  for (const type of ["pointerdown", "keydown"]) document.addEventListener(type, mark, {capture: true, once: true});
}"""
_RUNNING = "document.querySelector('[data-testid=\"stStatusWidgetRunningIcon\"]')"


def _measure(page, action, done: str, arg=None, what: str = "interaction") -> tuple[float, float]:
    """(in the page, driver wall) seconds of one interaction: ``action()`` performs it, ``done`` is a JS
    condition (of ``arg``) on the page that says it is drawn; both also wait until no script runs. In the page:
    from the input event (pointerdown / keydown) to the first animation frame where it is drawn — what the
    user waits; the driver's wall time adds Playwright's own checks before it clicks (an option of an opening
    list waits for the list to stop moving) and its round trips."""
    page.evaluate(_ARM)
    t = time.perf_counter()
    action()
    try:
        t1 = page.wait_for_function(f"(arg) => (({done})(arg) && !{_RUNNING}) ? performance.now() : false",
                                    arg=arg, polling="raf", timeout=60_000).json_value()
    except Exception as exc:
        shot = Path(tempfile.gettempdir()) / "bench-timeout.png"
        page.screenshot(path=str(shot), full_page=True)
        raise RuntimeError(f"{what}: not drawn within 60 s (page at {page.url}; screenshot {shot})") from exc
    wall = time.perf_counter() - t
    t0 = page.evaluate("() => window.__benchT0")
    if t0 is None:
        raise RuntimeError(f"{what}: the page saw no pointerdown or keydown")
    return (t1 - t0) / 1000, wall


def _token_interactions(paint, repeat: int) -> dict[str, list[tuple[float, float]]]:
    """In the Token view: a layer move (slider key press) and a token click, each timed until the URL
    follows and the script is idle."""
    page, _ = paint("tokens", "Token view")
    page.wait_for_selector(".lens-tokens .tok", state="attached", timeout=60_000)
    out: dict[str, list[tuple[float, float]]] = {"layer move": [], "token click": []}
    url_moved = "(b) => location.search !== b"
    for i in range(repeat):
        before = page.evaluate("() => location.search")
        slider = page.locator('[data-testid="stSlider"] input[type="range"]').first
        slider.focus()
        out["layer move"].append(_measure(page, lambda: slider.press("ArrowRight" if i % 2 == 0 else "ArrowLeft"),
                                          url_moved, before, "layer move"))
        tok = page.locator(".lens-tokens .tok").nth(20 + 7 * i)
        before = page.evaluate("() => location.search")
        out["token click"].append(_measure(page, tok.click, url_moved, before, "token click"))
    page.close()
    return out


def _grid_interactions(paint, repeat: int, bare: bool = False) -> dict[str, list[tuple[float, float]]]:
    """On the Logit lens page: switch the grid's colour (repainted in the page, no script rerun; timed
    until the table says the new colour), move its window and its positions (script reruns that rebuild
    the grid from saved arrays; timed until the new grid is drawn and the script is idle); empty when the
    results hold no grid."""
    page, _ = paint("lenses", "Logit / tuned lens")  # ``bare``: the baseline app's fragment (window change only)
    try:
        page.wait_for_selector("table.lens-grid a", state="visible", timeout=60_000)
    except Exception:
        page.close()
        return {}
    out: dict[str, list[tuple[float, float]]] = {"colour switch": [], "window change": [], "positions change": []}
    new_grid = "() => document.querySelector('table.lens-grid:not([data-bench-old])')"

    def timed(action, what: str) -> tuple[float, float]:
        # the table on the page is marked; done when an unmarked one is drawn (no serialising of the table)
        page.evaluate("() => document.querySelectorAll('table.lens-grid').forEach(g => g.dataset.benchOld = '1')")
        return _measure(page, action, new_grid, None, what)

    def recolour(label) -> tuple[float, float]:
        key = label.locator("input").get_attribute("value")
        return _measure(page, label.click, "(k) => document.querySelector('table.lens-grid').dataset.colour === k",
                        key, "colour switch")

    colours = page.locator(".lens-grid-colours label")
    windows = page.locator('[data-testid="stSelectbox"]').filter(has_text="document / window").first
    for i in range(repeat):
        if colours.count() > 1 and not bare:
            out["colour switch"].append(recolour(colours.nth(1 - i % 2)))
        windows.click()
        options = page.locator('[role="option"]')
        options.first.wait_for(timeout=10_000)
        n_opt = options.count()
        # the list is virtualised (the options shown depend on where it opens): take the next one shown that is
        # not the window on the page, or nothing changes and no new grid is drawn
        pick = next((options.nth((i + 1 + j) % n_opt) for j in range(n_opt)
                     if options.nth((i + 1 + j) % n_opt).get_attribute("aria-selected") != "true"), None)
        if n_opt > 1 and pick is not None:
            out["window change"].append(timed(pick.click, "window change"))
        else:
            page.keyboard.press("Escape")
        thumb = page.locator('[data-testid="stSlider"]').filter(has_text="positions").locator(
            'input[type="range"], [role="slider"]')  # none in the bare app
        if thumb.count():
            # the window's selectbox may still hold the focus after its rerun: the arrow key must reach the thumb
            for _ in range(50):
                thumb.last.focus()
                if page.evaluate("() => document.activeElement?.getAttribute('role') === 'slider'"):
                    break
                time.sleep(0.1)
            out["positions change"].append(timed(lambda: page.keyboard.press("ArrowLeft"), "positions change"))
    page.close()
    return {k: v for k, v in out.items() if v}


def _print_interactions(title: str, times: dict) -> None:
    print(f"\n{title:<28}{'in page (s)':>12}{'driver (s)':>12}   goal < {SLIDER_GOAL_S} s (in page: input event to drawn)")
    for name, pairs in times.items():
        print(f"{name:<28}{statistics.median(p[0] for p in pairs):>12.3f}{statistics.median(p[1] for p in pairs):>12.3f}")


if __name__ == "__main__":
    sys.exit(main())
