"""lens.runtime.atomic: a file or folder is replaced whole or not at all, and a failed write leaves nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lens.runtime.atomic import atomic_dir, atomic_path, write_json_file, write_text_atomic


def test_a_failed_write_keeps_the_old_file_and_leaves_no_tmp(tmp_path):
    path = tmp_path / "a.json"
    write_json_file(path, {"x": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert json.loads(path.read_text()) == {"x": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    write_text_atomic(path, "new", sync=False)
    assert path.read_text() == "new"


def test_a_writer_that_appends_its_own_suffix(tmp_path):
    path = tmp_path / "s.npz"
    with atomic_path(path, ".npz") as tmp:
        np.savez(tmp, a=np.arange(3))  # np.savez would add .npz to a name without it
    with np.load(path) as z:
        assert z["a"].tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.npz"]


def test_a_folder_is_renamed_into_place_and_the_first_one_wins(tmp_path):
    target = tmp_path / "cache" / "model"
    with atomic_dir(target) as tmp:
        (tmp / "weights").write_text("first")
    with atomic_dir(target) as tmp:  # another process filled it first: its copy stays
        (tmp / "weights").write_text("second")
    assert (target / "weights").read_text() == "first"
    with pytest.raises(RuntimeError):
        with atomic_dir(tmp_path / "cache" / "other") as tmp:
            (tmp / "weights").write_text("half")
            raise RuntimeError("killed")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["model"]
