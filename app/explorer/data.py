"""Cached reads of results folders and stores for the explorer (``st.cache_data``).

Everything is keyed by a configured root and a path relative to it, checked by
:func:`app.explorer.paths.safe_path` before anything is opened. Nothing here computes a study.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import streamlit as st

import lens  # the facade: its names load their modules (torch) on first use, in the functions that use them
from app.explorer.paths import UnsafePathError, relative_to_root, safe_path
from app.explorer.state import Roots
from lens.errors import LensInputError
from lens.runtime.frozen_json import thaw
from lens.store.fidelity import describe
from lens.store.layout import is_store
from studies.core.registry import declaration
from studies.job.rows import JOB_FILE, MainJobRecord
from studies.logit_lens.declaration import A as LOGIT_LENS_ARRAYS
from studies.reporting.headlines import store_mark
from studies.reporting.results import RESULT_FILE, ResultRecord, find_results, read_arrays_file, store_candidates

TTL_S = 60  # results written while the app is open show up within a minute (or on "Reload")


@dataclass(frozen=True)
class RunResult:
    """One results folder under the results root: ``rel`` (its path under the root), ``run`` (the
    folder it sits in: one main job, :class:`studies.reporting.findings.Run`) and its
    :class:`studies.reporting.results.ResultRecord`."""

    rel: str
    run: str
    record: ResultRecord


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _scan(results_root: str) -> tuple[list[RunResult], list[tuple[str, str]]]:
    root = safe_path(results_root, "")
    out, skipped = [], []
    for rec in find_results(root, skipped):
        rel = relative_to_root(root, rec.path)
        parent = Path(rel).parent.as_posix()
        if parent == ".":  # a run written straight into the root: name it after the root folder
            parent = root.name or "."
        out.append(RunResult(rel=rel, run=parent, record=rec))
    return out, [(relative_to_root(root, folder), why.replace(f"{root}/", "")) for folder, why in skipped]


def list_runs(results_root: str) -> list[RunResult]:
    """Every results folder under the root whose record reads."""
    return _scan(results_root)[0]


def unreadable_runs(results_root: str) -> list[tuple[str, str]]:
    """(folder under the root, why) for each results folder whose record cannot be read (left out of
    :func:`list_runs`)."""
    return _scan(results_root)[1]


def runs_of(results_root: str, study: str) -> list[RunResult]:
    return [r for r in list_runs(results_root) if r.record.study == study]


def read_arrays(results_root: str, rel: str) -> Mapping[str, np.ndarray]:
    """The result's arrays.npz as a read-only mapping of read-only numpy arrays (no pickle), shared by
    every session and rerun while the file stays the same (its size and modification time). A damaged
    file raises LensInputError naming it (under "results", not the server's path)."""
    path = safe_path(results_root, rel) / "arrays.npz"
    if not path.is_file():
        return MappingProxyType({})
    stat = path.stat()
    try:
        return _read_arrays(str(path), stat.st_mtime_ns, stat.st_size)
    except LensInputError as exc:
        raise LensInputError(str(exc).replace(str(safe_path(results_root, "")), "results")) from None


def load_arrays(results_root: str, rel: str) -> Mapping[str, np.ndarray]:
    """:func:`read_arrays` for a page that shows this result: a damaged file is one error naming it, and
    the page stops there."""
    try:
        return read_arrays(results_root, rel)
    except LensInputError as exc:
        st.error(str(exc))
        st.stop()


# cache_resource, not cache_data: cache_data unpickles a fresh copy on every call (30 ms for a 20k-token
# logit-lens result at each grid switch); the arrays are made read-only instead
@st.cache_resource(max_entries=16, show_spinner=False)
def _read_arrays(path: str, mtime_ns: int, size: int) -> Mapping[str, np.ndarray]:
    out = read_arrays_file(path)
    for a in out.values():
        a.setflags(write=False)
    return MappingProxyType(out)


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


def per_token_metrics(study: str, arrays: dict) -> dict:
    """name -> (layer, token) float array for every per-token measurement the study declares
    (:meth:`studies.core.contract.ResultSpec.per_token`); none for an unregistered study."""
    spec = _spec(study)
    if spec is None or token_index(study, arrays) is None:
        return {}
    return {f.name: arrays[f.name].astype(np.float32) for f in spec.per_token() if f.name in arrays}


def spec(study: str):
    """The study's declared :class:`studies.core.contract.ResultSpec` (names, labels, units, layer axis), read
    from its plain-data declaration (no torch, no compute code); None for an unregistered study."""
    found = declaration(study)
    return None if found is None else found.result


_spec = spec


def token_index(study: str, arrays: dict):
    """Store rows of the study's per-token arrays: the array its declaration names for the ``token`` axis."""
    spec = _spec(study)
    if spec is None or spec.token_rows not in arrays:
        return None
    return arrays[spec.token_rows].astype(np.int64)


@st.cache_data(max_entries=8, show_spinner=False)
def store_tokens(stores_root: str, rel: str) -> dict:
    """The token table of a store under the stores root (or under the results root's runs)."""
    store = lens.open_store(safe_path(stores_root, rel))
    return {k: np.asarray(v) for k, v in store.tokens.items()}


@st.cache_data(max_entries=8, show_spinner=False)
def store_manifest(root: str, rel: str) -> dict:
    """The manifest of a store under ``root``, its schema and checksum checked (a damaged one raises
    LensInputError naming the file: lens.store.format.read_manifest)."""
    from lens.store.format import read_manifest

    return read_manifest(safe_path(root, rel))


def store_fidelity(manifest: dict) -> list[str]:
    """The store's fidelity record as lines, the verdict first (lens.store.fidelity; "not recorded" for a
    store from before records; one line saying so for a malformed record)."""
    try:
        return describe(manifest)
    except LensInputError as exc:
        return [str(exc)]


def silently_wrong_results(found) -> list[tuple[str, str, str]]:
    """(run, study, mark) of each listed result computed from a store whose fidelity check is silently wrong (a
    store kept with --allow-silently-wrong, or merged from such a part: studies.reporting.headlines.store_mark)."""
    return [(r.run, r.record.study, store_mark(r.record)) for r in found if store_mark(r.record)]


@st.cache_data(ttl=TTL_S, show_spinner=False)
def list_stores(root: str) -> list[str]:
    """Folders (relative to ``root``) holding a store manifest."""
    base = safe_path(root, "")
    if not base.is_dir():
        return []
    return sorted(relative_to_root(base, p.parent) for p in base.rglob("manifest.json")
                  if (p.parent / "shards").is_dir())


TEXT_FROM_RESULT, TEXT_FROM_STORE, TEXT_AS_ROWS = "result", "store", "rows"  # where token_texts found the words


def token_texts(roots, run: RunResult, arrays: dict, index, with_source: bool = False):
    """Token strings for the rows ``index``: the result's own token-text array (its declaration's
    ``token_text``), else the token table of the store the study read (:func:`find_store`), else ``#row``.
    ``with_source``: (texts, one of TEXT_FROM_RESULT / TEXT_FROM_STORE / TEXT_AS_ROWS)."""
    spec = _spec(run.record.study)
    own = None if spec is None else arrays.get(spec.token_text)
    texts, source = None, TEXT_AS_ROWS
    if own is not None and len(own) == len(index):
        texts, source = own.astype(str), TEXT_FROM_RESULT
    else:
        found = run_store(roots, run)
        if found is not None:
            toks = store_tokens(*found)["token"]
            if index.max(initial=-1) < len(toks):
                texts, source = toks[index].astype(str), TEXT_FROM_STORE
    if texts is None:
        texts = np.array([f"#{j}" for j in index])
    return (texts, source) if with_source else texts


@dataclass(frozen=True)
class StoreLookup:
    """Where :func:`find_store` looked for the store a result read: ``recorded`` (its ``config.store``,
    None when it read none), ``found`` ((root, path under it) or None) and ``looked`` (every place
    tried, each with why it was not taken)."""

    recorded: str | None
    found: tuple[str, str] | None
    looked: tuple[str, ...] = ()

    def message(self) -> str:
        """One line for the page when the store was not found (empty when it was)."""
        if self.found is not None:
            return ""
        if not self.recorded:
            return "this result records no store (its study read none)"
        return (f"the store this run read (recorded as `{self.recorded}`) was not found; looked at: "
                + "; ".join(self.looked))


def find_store(roots, run: RunResult) -> StoreLookup:
    """The store the study read, wherever the results folder now lies.

    A result records its store (``config.store``) as the job was given it: ``results/store``, relative
    to the folder the job ran in, or an absolute path of the machine it ran on. Tried in order: the
    recorded path (a relative one from the folder the explorer runs in); its last components under the
    run's folder (the job's ``--out``: ``results/store`` -> ``RUN/store``, ``results/x/store`` ->
    ``RUN/x/store``), which finds it after the results folder is copied or moved; then every store under
    the stores and results roots whose folder name is the recorded one. A candidate counts only when it
    lies under the results or the stores root (nothing else is opened) and its manifest names the
    result's model and corpus."""
    recorded = (run.record.config or {}).get("store")
    if not recorded:
        return StoreLookup(None, None)
    looked: list[str] = []
    seen: set = set()

    def consider(path: Path, how: str):
        path = path.expanduser().resolve()
        if path in seen:
            return None
        seen.add(path)
        root = _root_holding(roots, path)
        if root is None:
            looked.append(f"{path} ({how}; outside the results and stores roots, not opened)")
            return None
        if not is_store(path):
            looked.append(f"{path} ({how}; no store there)")
            return None
        rel = relative_to_root(root, path)
        try:
            manifest = store_manifest(root, rel)
        except LensInputError as exc:
            looked.append(f"{path} ({how}; damaged: {exc})")
            return None
        problem = _store_mismatch(manifest, run.record)
        if problem:
            looked.append(f"{path} ({how}; {problem})")
            return None
        return root, rel

    first, *under_run = store_candidates(recorded, Path(run.record.path).parent)
    found = consider(first if first.is_absolute() else Path.cwd() / first, "the recorded path")
    for candidate in under_run:
        if found is None:
            found = consider(candidate, "under the results folder")
    name = Path(recorded).name
    if found is None and name:
        for root in dict.fromkeys((roots.stores, roots.results)):
            try:
                named = [rel for rel in list_stores(root) if Path(rel).name == name]
            except UnsafePathError:
                named = []
            if not named:
                looked.append(f"stores named {name!r} under {root} (none)")
            for rel in named:
                found = found or consider(Path(root) / rel, f"a store named {name!r} under a root")
    return StoreLookup(str(recorded), found, tuple(looked))


def _root_holding(roots, path: Path) -> str | None:
    """The first of the results and stores roots that ``path`` lies under (:func:`safe_path`), or None."""
    for root in (roots.results, roots.stores):
        try:
            safe_path(root, str(path))
        except UnsafePathError:
            continue
        return root
    return None


def _store_mismatch(manifest: dict, record: ResultRecord) -> str | None:
    """Why a store's manifest is not the one ``record`` was computed from (model, corpus), or None."""
    model = (manifest.get("model") or {}).get("model_id")
    corpus = (manifest.get("corpus") or {}).get("name")
    if model != record.model:
        return f"a store of {model!r}, not {record.model!r}"
    if record.corpus and corpus and corpus != record.corpus:
        return f"a store of corpus {corpus!r}, not {record.corpus!r}"
    return None


def run_store(roots, run: RunResult) -> tuple[str, str] | None:
    """(root, path under it) of the store the study read (:func:`find_store`), or None."""
    return find_store(roots, run).found


@st.cache_data(ttl=TTL_S, show_spinner=False)
def token_sources(results_root: str) -> list[dict]:
    """Per-token metrics on offer: {label, rel, name, has_text}, those with token text first."""
    out = []
    for r in list_runs(results_root):
        rec = r.record
        try:
            arrays = read_arrays(results_root, r.rel)
        except LensInputError:  # a damaged result offers no per-token metric; its own page names the file
            continue
        spec = _spec(rec.study)
        for name in per_token_metrics(rec.study, arrays):
            out.append({"label": f"{rec.study}: {name} — {r.run} · {rec.model} · {rec.corpus} · "
                                 f"{rec.n_tokens} tokens", "rel": r.rel, "name": name, "run": r.run,
                        "study": rec.study, "has_text": spec.token_text in arrays})
    return sorted(out, key=lambda s: not s["has_text"])


# Shared read-only arrays (cache_resource, not cache_data): at 100k tokens x 30 layers these are tens of
# MB, and cache_data would hand every rerun — every slider move — a fresh copy.
@st.cache_resource(ttl=TTL_S, max_entries=16, show_spinner=False)
def token_matrix(results_root: str, stores_root: str, rel: str, name: str) -> dict:
    """{values (layer, token) float32, index (token,), texts (token,), order (corpus order), layers, run,
    texts_from (where the words came from: TEXT_FROM_*)} — the arrays read-only."""
    run = next(r for r in list_runs(results_root) if r.rel == rel)
    arrays = load_arrays(results_root, rel)
    values = per_token_metrics(run.record.study, arrays)[name]
    index = token_index(run.record.study, arrays)
    texts, texts_from = token_texts(Roots(results_root, stores_root), run, arrays, index, with_source=True)
    out = {"values": values, "index": index, "texts": texts, "order": np.argsort(index, kind="stable"),
           "layers": [int(l) for l in run.record.layers], "run": run, "texts_from": texts_from}
    for k in ("values", "index", "texts", "order"):
        out[k].setflags(write=False)
    return out


@st.cache_resource(ttl=TTL_S, max_entries=8, show_spinner=False)
def topk_table(results_root: str, rel: str) -> dict | None:
    """A logit-lens result's per-token top-k: {tokens (layer, row, k), probs, row_of: store row -> row}."""
    arrays = load_arrays(results_root, rel)
    a = LOGIT_LENS_ARRAYS
    if not {a.topk_str, a.topk_probs, a.topk_rows} <= set(arrays):
        return None
    idx = arrays[a.topk_rows].astype(np.int64)
    return {"tokens": arrays[a.topk_str], "probs": arrays[a.topk_probs],
            "row_of": {int(r): i for i, r in enumerate(idx[: arrays[a.topk_str].shape[1]])}}


JOB_DEPTH = 2  # main_job.json files looked for in the results root and up to two folders below it


@st.cache_data(ttl=5, show_spinner=False)
def job_states(results_root: str) -> list[dict]:
    """:func:`read_job_states`, read again at most every 5 s."""
    return read_job_states(results_root)


def clear_results_cache() -> None:
    """Forget the cached scan of the results root and the jobs' states: a study that just finished is read
    on the next run (what "Reload results" does for the listings, without clearing every other cache)."""
    _scan.clear()
    job_states.clear()


def read_job_states(results_root: str) -> list[dict]:
    """Every main job under the results root as its ``main_job.json`` stands now: {run (its folder, named
    as :attr:`RunResult.run` names it), finished, stopped (why it ended unfinished: Ctrl-C, SIGTERM; else None),
    elapsed_s (the job's, now), updated_s (seconds since the file was written), studies (its rows: study,
    status, started, estimate_s, error, seconds, line), jobs (its worker processes)}."""
    root = safe_path(results_root, "")
    if not root.is_dir():
        return []
    files = [root / JOB_FILE] + [p for d in range(1, JOB_DEPTH + 1) for p in root.glob("/".join(["*"] * d) + "/" + JOB_FILE)]
    now = time.time()
    out = []
    for path in files:
        try:
            job = MainJobRecord.read(path)  # parsed and checked once
            updated = now - path.stat().st_mtime
        except (OSError, LensInputError):
            continue
        if not job.has_studies:
            continue
        rel = relative_to_root(root, path.parent)
        finished = bool(job.finished)
        wall = job.wall_time_s or 0.0
        out.append({"run": (root.name or ".") if rel == "." else rel, "finished": finished, "stopped": job.stopped,
                    "elapsed_s": wall if finished or job.stopped else wall + updated, "updated_s": updated,
                    "jobs": job.jobs, "studies": [thaw(r) for r in job.row_list()]})
    return out


def result_json_bytes(results_root: str, rel: str) -> bytes:
    """The result's result.json as written."""
    return (safe_path(results_root, rel) / RESULT_FILE).read_bytes()


def arrays_npz_bytes(results_root: str, rel: str) -> bytes:
    """The result's saved arrays as one .npz (numeric and string arrays only, no pickle)."""
    buf = io.BytesIO()
    np.savez_compressed(buf, **load_arrays(results_root, rel))
    return buf.getvalue()
