"""Nearest tokens: pick a store, a site, a layer and a token; see the corpus tokens whose states are
nearest it there, with their contexts. The layer is held on the explorer's --store-device; no model runs."""

import html

import numpy as np
import streamlit as st

from app.explorer import nearest, ui
from app.explorer.paths import UnsafePathError
from lens.errors import LensInputError

st.title("Nearest tokens")
roots = ui.roots()
try:
    choices = nearest.store_choices(roots)
except UnsafePathError as exc:
    st.error(str(exc))
    st.stop()
if not choices:
    st.info(f"no results or stores with activations yet: run `lens study all --model smollm2-135m --out "
            f"{roots.results}/<run>` (its store is listed here), or `lens capture smollm2-135m --out "
            f"{roots.stores}/<name>`")
    st.stop()

c1, c2 = st.columns([3, 1])
i = c1.selectbox("store", range(len(choices)), key="nt-store",
                 format_func=lambda j: f"{'stores' if choices[j][0] == roots.stores else 'results'}: {choices[j][1]}")
root, rel = choices[i or 0]
try:
    store = nearest.disk_store(root, rel)
except LensInputError as exc:  # a damaged store: say which and why, and stop here
    st.error(str(exc).replace(f"{root}/", ""))
    st.stop()
site = c2.selectbox("site", store.sites, key="nt-site")
layers = store.layers(site)
layer = ui.layer_slider(layers, key="nt-layer") if layers else None
tokens = store.tokens
text = tokens["token"]
st.caption(f"{store.model_id} · {store.n_tokens} tokens × {store.d_model} · {store.dtype} · "
           f"layers are held on `{roots.store_device}` (`lens app --store-device`)")

how = st.radio("find the token", ["by window", "by text"], horizontal=True, key="nt-how")
if how == "by window":
    from studies.core.sampling import window_bounds

    starts, ends = window_bounds(tokens)
    w = st.number_input(f"window (of {len(starts)})", 0, len(starts) - 1, 0, key="nt-window")
    rows = np.arange(starts[w], ends[w])
    row = st.selectbox("token", rows, index=min(8, len(rows) - 1), key="nt-row",
                       format_func=lambda r: f"pos {tokens['pos'][r]}: {str(text[r])!r}")
    spans = "".join(
        f"<span title='row {r}, pos {tokens['pos'][r]}' style='{'background:#f5c542;' if r == row else ''}"
        f"border-radius:2px'>{html.escape(str(text[r]).replace(chr(10), '⏎'))}</span>" for r in rows)
    st.markdown("<div style='line-height:1.9;font-family:monospace;white-space:pre-wrap'>" + spans + "</div>",
                unsafe_allow_html=True)
else:
    needle = st.text_input("token text contains", "the", key="nt-find")
    low = np.char.lower(np.char.strip(text.astype(str)))
    hits = np.nonzero(np.char.find(low, needle.strip().lower()) >= 0)[0][:500] if needle.strip() else []
    if not len(hits):
        st.info(f"no token of this store contains {needle!r}")
        st.stop()
    ctx = {c.row: c for c in store.contexts(hits, 4)}
    row = st.selectbox(f"token ({len(hits)} shown)", hits, key="nt-hit",
                       format_func=lambda r: f"row {r}: {ctx[r].marked()!s}".replace("\n", "⏎"))

st.subheader(f"Nearest tokens to {str(text[row])!r}")
nearest.section(root, rel, site, layer, int(row), "nt", device=roots.store_device)
