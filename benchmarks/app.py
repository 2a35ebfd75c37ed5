"""Explorer responsiveness: first render of every page and a layer-slider move, on results sized like a
100k-token SmolLM2 run (30 layers, d_model 576; synthetic folders with every study's keys, see
tests/synthetic_runs.py — a real 100k-token main job takes far longer than this benchmark should).

Goals: first render < 2 s per page, slider move < 0.3 s. Timings are `streamlit.testing` runs (the
script's own time, no browser), median of ``--repeat`` runs, the cache cleared before each first render.

    .venv/bin/python benchmarks/app.py [--tokens 100000] [--layers 30] [--repeat 3] [--keep DIR]
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
SLIDERS = [("tokens", "tok-layer"), ("geometry", "an-layer"), ("senses", "se-layer")]
FIRST_RENDER_GOAL_S, SLIDER_GOAL_S = 2.0, 0.3


def _app(page):
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(ROOT / "app" / "views" / f"{page}.py"), default_timeout=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", default=None, help="write the synthetic results here and keep them")
    args = parser.parse_args(argv)

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
    os.environ["LENS_APP_RESULTS"] = str(root)
    os.environ["LENS_APP_STORES"] = str(root)
    _app("senses").run()  # import streamlit, plotly, numpy once: not part of any page's render

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
    for page, key in SLIDERS:
        at = _app(page).run()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
