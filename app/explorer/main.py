"""Lens Workbench explorer: ``streamlit run app/explorer/main.py -- --results DIR --stores DIR`` (or ``lens app``)."""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `streamlit run app/explorer/main.py` puts app/explorer/ on the path, not the repo
    sys.path.insert(0, str(ROOT))

from app.explorer.state import get_roots, parse_args, set_roots  # noqa: E402
from app.explorer.watch import job_panel  # noqa: E402

VIEWS = Path(__file__).resolve().parent / "views"
# (file, title). No icons: Streamlit fetches a ":material/...:" page icon's SVG from fonts.gstatic.com for
# the tab's favicon (a request off this machine on every page view, 13 failed requests offline), and an
# emoji needs an emoji font many Linux machines lack. The page makes no request outside the explorer's address.
PAGES = [
    ("overview.py", "Overview"),
    ("tokens.py", "Token view"),
    ("nearest.py", "Nearest tokens"),
    ("prediction.py", "Prediction gains"),
    ("lenses.py", "Logit / tuned lens"),
    ("ablation.py", "Layer ablation"),
    ("geometry.py", "Geometry"),
    ("senses.py", "Senses"),
    ("probes.py", "Probes"),
    ("knobs.py", "Context knobs"),
    ("compare.py", "Compare"),
    ("studies.py", "Studies"),
    ("live.py", "Live"),
]

st.set_page_config(page_title="Lens Workbench", layout="wide")
if "lens_roots" not in st.session_state:
    set_roots(parse_args(sys.argv[1:]))
roots = get_roots()
with st.sidebar:
    st.caption(f"results: `{roots.results}`  \nstores: `{roots.stores}`  \nstore device: `{roots.store_device}`")
    if st.button("Reload results", key="reload"):
        st.cache_data.clear()
    job_panel(detail=False)  # a running main job, one line; every page picks up a study's result as it lands
# expanded: every page's link shown (past 12 pages Streamlit folds the rest behind "View more")
page = st.navigation([st.Page(str(VIEWS / f), title=t, url_path=f[:-3]) for f, t in PAGES], expanded=True)
page.run()
