"""Lens Workbench explorer: ``streamlit run app/main.py -- --results DIR --stores DIR`` (or ``lens app``)."""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run app/main.py` puts app/ on the path, not the repo
    sys.path.insert(0, str(ROOT))

from app.state import get_roots, parse_args, set_roots  # noqa: E402

VIEWS = Path(__file__).resolve().parent / "views"
PAGES = [  # (file, title, icon)
    ("overview.py", "Overview", ":material/home:"),
    ("tokens.py", "Token view", ":material/text_fields:"),
    ("nearest.py", "Nearest tokens", ":material/hub:"),
    ("prediction.py", "Prediction gains", ":material/trending_down:"),
    ("lenses.py", "Logit / tuned lens", ":material/visibility:"),
    ("ablation.py", "Layer ablation", ":material/layers_clear:"),
    ("geometry.py", "Geometry", ":material/scatter_plot:"),
    ("senses.py", "Senses", ":material/category:"),
    ("probes.py", "Probes", ":material/science:"),
    ("knobs.py", "Context knobs", ":material/tune:"),
    ("compare.py", "Compare", ":material/compare:"),
    ("studies.py", "Studies", ":material/list_alt:"),
    ("live.py", "Live", ":material/bolt:"),
]

st.set_page_config(page_title="Lens Workbench", layout="wide")
if "lens_roots" not in st.session_state:
    set_roots(parse_args(sys.argv[1:]))
roots = get_roots()
with st.sidebar:
    st.caption(f"results: `{roots.results}`  \nstores: `{roots.stores}`  \nstore device: `{roots.store_device}`")
    if st.button("Reload results", key="reload"):
        st.cache_data.clear()
# expanded: every page's link shown (past 12 pages Streamlit folds the rest behind "View more")
page = st.navigation([st.Page(str(VIEWS / f), title=t, icon=i, url_path=f[:-3]) for f, t, i in PAGES], expanded=True)
page.run()
