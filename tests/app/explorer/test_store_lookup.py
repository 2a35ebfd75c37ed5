"""The store a result read is found from its results folder, wherever that folder now lies
(:func:`app.explorer.data.find_store`); when it cannot be, the message names every place looked.

A result records its store as the job was given it (``results/store``, relative to the folder the job
ran in); the explorer's roots are absolute. These tests write one real store (tiny-llama, 64 tokens)
and a real result.json beside it, as ``lens study all --out results`` lays them out."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.explorer import data
from app.explorer.state import Roots


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """FOLDER/results/{store, linearity/result.json}, the result recording ``results/store``."""
    import lens
    from studies.reporting.results import write_result

    folder = tmp_path_factory.mktemp("job")
    store = lens.capture("tiny-llama", corpus="wiki-sample", sites=["resid_post"], max_tokens=64, seq_len=32,
                         out=folder / "results" / "store", progress=False)
    write_result(folder / "results" / "linearity", study="linearity", model=store.model_id, corpus="wiki-sample",
                 n_tokens=store.n_tokens, config={"model": "tiny-llama", "store": "results/store"}, layers=[0, 1],
                 metrics={"linearity": [0.9, 0.95]})
    return folder


def _lookup(results, stores, cwd, monkeypatch):
    monkeypatch.chdir(cwd)
    roots = Roots(str(Path(results).resolve()), str(Path(stores).resolve()))
    run = next(r for r in data.list_runs(roots.results) if r.record.study == "linearity")
    return roots, data.find_store(roots, run)


def test_readme_layout_found_from_any_folder(job, tmp_path, monkeypatch):
    # `lens app --results results --stores stores` from the folder the job ran in, and from elsewhere
    for cwd in (job, tmp_path):
        roots, found = _lookup(job / "results", job / "stores", cwd, monkeypatch)
        assert found.found == (roots.results, "store"), found.looked
        assert found.message() == ""


def test_moved_results_folder_found_under_it(job, tmp_path, monkeypatch):
    moved = tmp_path / "elsewhere" / "run-1"
    shutil.copytree(job / "results", moved)
    roots, found = _lookup(tmp_path / "elsewhere", tmp_path / "nostores", job, monkeypatch)
    # the recorded path (JOB/results/store, from the explorer's folder) lies outside the roots: not opened
    assert found.found == (roots.results, "run-1/store"), found.looked
    assert any("outside the results and stores roots, not opened" in line for line in found.looked)


def test_store_moved_under_the_stores_root_found_by_name(job, tmp_path, monkeypatch):
    results = tmp_path / "results"
    shutil.copytree(job / "results" / "linearity", results / "smol" / "linearity")
    shutil.copytree(job / "results" / "store", tmp_path / "stores" / "smol" / "store")
    roots, found = _lookup(results, tmp_path / "stores", tmp_path, monkeypatch)
    assert found.found == (roots.stores, "smol/store"), found.looked


def test_store_of_another_model_is_not_taken(job, tmp_path, monkeypatch):
    import json

    results = tmp_path / "results"
    shutil.copytree(job / "results", results / "run")
    manifest = results / "run" / "store" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["model"]["model_id"] = "other-model"
    manifest.write_text(json.dumps(m))
    roots, found = _lookup(results, tmp_path / "stores", tmp_path, monkeypatch)
    assert found.found is None  # edited by hand, the manifest fails its checksum: damaged, not taken
    assert "damaged" in found.message() and "checksum" in found.message()
    from lens.store.format import commit_manifest

    commit_manifest(manifest.parent, m)  # sealed again: a sound store of another model
    roots, found = _lookup(results, tmp_path / "stores", tmp_path, monkeypatch)
    assert found.found is None
    assert "a store of 'other-model', not 'tiny-llama'" in found.message()


def test_missing_store_message_names_every_place(job, tmp_path, monkeypatch):
    results = tmp_path / "results"
    shutil.copytree(job / "results" / "linearity", results / "run" / "linearity")
    (tmp_path / "stores").mkdir()
    roots, found = _lookup(results, tmp_path / "stores", tmp_path, monkeypatch)
    assert found.found is None
    text = found.message()
    assert text.startswith("the store this run read (recorded as `results/store`) was not found; looked at: ")
    for place in (tmp_path / "results" / "store",  # the recorded path, from the explorer's folder
                  results / "run" / "results" / "store", results / "run" / "store"):  # under the results folder
        assert f"{place.resolve()} (" in text, text
    assert f"stores named 'store' under {(tmp_path / 'stores').resolve()} (none)" in text
    assert f"stores named 'store' under {results.resolve()} (none)" in text


def test_result_without_store_says_so(job, tmp_path, monkeypatch):
    from studies.reporting.results import write_result

    write_result(tmp_path / "results" / "run" / "linearity", study="linearity", model="tiny-llama",
                 corpus="wiki-sample", n_tokens=1, config={"store": None}, layers=[0], metrics={})
    roots, found = _lookup(tmp_path / "results", tmp_path / "stores", tmp_path, monkeypatch)
    assert found.found is None and found.recorded is None
    assert found.message() == "this result records no store (its study read none)"
