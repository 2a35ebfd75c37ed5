"""The probing notebooks run top to bottom on tiny-llama (nbclient, the venv's python3 kernel, cwd = repo root)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "studies" / "notebooks").glob("*.ipynb"))


def test_notebooks_exist():
    assert {p.name for p in NOTEBOOKS} >= {"quickstart.ipynb", "probing_hypothesis.ipynb", "custom_analysis.ipynb"}


def test_notebooks_match_their_source():
    """The .ipynb files are generated from make_notebooks.py: they must not drift apart."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "studies" / "notebooks" / "make_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import nbformat

    for name, cells in mod.NOTEBOOKS.items():
        nb = nbformat.read(ROOT / "studies" / "notebooks" / name, as_version=4)
        assert [c.source for c in nb.cells] == [src for _, src in cells], name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
