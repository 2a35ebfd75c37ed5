"""Cached reads of results folders and stores for the explorer (``st.cache_data``).

Everything is keyed by a configured root and a path relative to it, checked by
:func:`app.paths.safe_path` before anything is opened. Nothing here computes a study.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import streamlit as st

from app.paths import relative_to_root, safe_path

# Arrays that map per-token rows back to the store's token table, in order of preference.
TOKEN_INDEX_KEYS = ("token_index", "test_rows", "token_rows", "rows")
TTL_S = 60  # results written while the app is open show up within a minute (or on "Reload")


@st.cache_data(ttl=TTL_S, show_spinner=False)
def list_runs(results_root: str) -> list[dict]:
    """Every results folder under the root, as plain dicts (rel, run, study, model, ...)."""
    from studies.results import find_results

    root = safe_path(results_root, "")
    out = []
    for rec in find_results(root):
        rel = relative_to_root(root, rec.path)
        parent = Path(rel).parent.as_posix()
        if parent == ".":  # a run written straight into the root: name it after the root folder
            parent = root.name or "."
        out.append({"rel": rel, "run": parent, "study": rec.study, "model": rec.model, "corpus": rec.corpus,
                    "n_tokens": rec.n_tokens, "created": rec.created, "layers": rec.layers,
                    "metrics": rec.metrics, "summary": rec.summary, "config": rec.config,
                    "versions": rec.versions, "git_revision": rec.git_revision,
                    "wall_time_s": rec.wall_time_s, "extra": rec.extra})
    return out


def runs_of(results_root: str, study: str) -> list[dict]:
    return [r for r in list_runs(results_root) if r["study"] == study]


@st.cache_data(max_entries=64, show_spinner=False)
def load_arrays(results_root: str, rel: str) -> dict:
    """The result's arrays.npz as a dict of numpy arrays (no pickle)."""
    path = safe_path(results_root, rel) / "arrays.npz"
    if not path.is_file():
        return {}
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@st.cache_data(max_entries=64, show_spinner=False)
def load_figures(results_root: str, rel: str) -> dict:
    """name -> plotly figure dict, from the result's figures/*.json."""
    folder = safe_path(results_root, rel) / "figures"
    out = {}
    if folder.is_dir():
        for p in sorted(folder.glob("*.json")):
            try:
                out[p.stem] = json.loads(p.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                continue
    return out


def per_token_metrics(arrays: dict, n_layers: int) -> dict:
    """name -> (layer, token) float array for every per-token array in a result.

    A per-token array is 2-D with one axis the result's layers and the other the rows of the token
    index (``token_index`` / ``test_rows``); (token, layer) arrays are transposed.
    """
    index = token_index(arrays)
    if index is None:
        return {}
    n = len(index)
    out = {}
    for k, a in arrays.items():
        if k in TOKEN_INDEX_KEYS or a.ndim != 2 or not np.issubdtype(a.dtype, np.number) or _not_a_metric(k):
            continue
        if a.shape == (n_layers, n):
            out[k] = a.astype(np.float32)
        elif a.shape == (n, n_layers):
            out[k] = a.T.astype(np.float32)
    return out


def _not_a_metric(name: str) -> bool:
    """Token ids and predicted-token ids are per-token arrays too, but colouring by them means nothing."""
    return name.endswith(("_id", "_ids", "top1")) or "_id_" in name


def token_index(arrays: dict):
    """Store rows of the per-token arrays: an explicit index, else every row when the result carries the
    whole token table (a ``token`` column, as the logit-lens study writes)."""
    for k in TOKEN_INDEX_KEYS:
        if k in arrays and arrays[k].ndim == 1:
            return arrays[k].astype(np.int64)
    if "token" in arrays and arrays["token"].ndim == 1:
        return np.arange(len(arrays["token"]), dtype=np.int64)
    return None


@st.cache_data(max_entries=8, show_spinner=False)
def store_tokens(stores_root: str, rel: str) -> dict:
    """The token table of a store under the stores root (or under the results root's runs)."""
    import lens

    store = lens.open_store(safe_path(stores_root, rel))
    return {k: np.asarray(v) for k, v in store.tokens.items()}


@st.cache_data(max_entries=8, show_spinner=False)
def store_manifest(root: str, rel: str) -> dict:
    path = safe_path(root, rel) / "manifest.json"
    return json.loads(path.read_text(encoding="utf-8"))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def list_stores(root: str) -> list[str]:
    """Folders (relative to ``root``) holding a store manifest."""
    base = safe_path(root, "")
    if not base.is_dir():
        return []
    return sorted(relative_to_root(base, p.parent) for p in base.rglob("manifest.json")
                  if (p.parent / "shards").is_dir())


def token_texts(roots, rec: dict, arrays: dict, index) -> "np.ndarray":
    """Token strings for the rows ``index``: the result's own ``token`` array, else the token table of the
    store the study read (``config.store``) when that store lies under one of the roots, else ``#row``."""
    from app.paths import UnsafePathError

    if "token" in arrays and len(arrays["token"]) == len(index):
        return arrays["token"].astype(str)
    store = (rec.get("config") or {}).get("store")
    if store:
        for root in (roots.results, roots.stores):
            try:
                path = safe_path(root, store)
            except UnsafePathError:
                continue
            if (path / "manifest.json").is_file():
                toks = store_tokens(root, relative_to_root(root, path))["token"]
                if index.max(initial=-1) < len(toks):
                    return toks[index].astype(str)
    return np.array([f"#{j}" for j in index])


@st.cache_data(ttl=TTL_S, show_spinner=False)
def token_sources(results_root: str) -> list[dict]:
    """Per-token metrics on offer: {label, rel, name, has_text}, those with token text first."""
    out = []
    for r in list_runs(results_root):
        arrays = load_arrays(results_root, r["rel"])
        for name in per_token_metrics(arrays, len(r["layers"])):
            out.append({"label": f"{r['study']}: {name} — {r['run']} · {r['model']} · {r['corpus']} · "
                                 f"{r['n_tokens']} tokens", "rel": r["rel"], "name": name,
                        "has_text": "token" in arrays})
    return sorted(out, key=lambda s: not s["has_text"])


# Shared read-only arrays (cache_resource, not cache_data): at 100k tokens x 30 layers these are tens of
# MB, and cache_data would hand every rerun — every slider move — a fresh copy.
@st.cache_resource(ttl=TTL_S, max_entries=16, show_spinner=False)
def token_matrix(results_root: str, stores_root: str, rel: str, name: str) -> dict:
    """{values (layer, token) float32, index (token,), texts (token,), order (corpus order)} — read-only."""
    from app.state import Roots

    rec = next(r for r in list_runs(results_root) if r["rel"] == rel)
    arrays = load_arrays(results_root, rel)
    values = per_token_metrics(arrays, len(rec["layers"]))[name]
    index = token_index(arrays)
    texts = token_texts(Roots(results_root, stores_root), rec, arrays, index)
    out = {"values": values, "index": index, "texts": texts, "order": np.argsort(index, kind="stable"),
           "layers": [int(l) for l in rec["layers"]], "rec": rec}
    for k in ("values", "index", "texts", "order"):
        out[k].setflags(write=False)
    return out


@st.cache_resource(ttl=TTL_S, max_entries=8, show_spinner=False)
def topk_table(results_root: str, rel: str) -> dict | None:
    """A lens result's per-token top-k: {tokens (layer, token, k), probs or None, row_of: store row -> column}."""
    arrays = load_arrays(results_root, rel)
    key = next((k for k in ("topk_str", "topk_tokens") if k in arrays), None)
    idx = arrays["topk_rows"].astype(np.int64) if "topk_rows" in arrays else token_index(arrays)
    if key is None or idx is None or arrays[key].ndim != 3:
        return None
    return {"tokens": arrays[key], "probs": arrays.get("topk_probs"),
            "row_of": {int(r): i for i, r in enumerate(idx[: arrays[key].shape[1]])}}
