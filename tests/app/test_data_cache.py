"""The explorer's shared result arrays (app/data.py): one read-only copy per file version, read again when
the file changes (a study rerun while the explorer is open), none for a folder without arrays."""

from __future__ import annotations

import os

import numpy as np
import pytest

from app import data


def test_arrays_are_shared_read_only_and_follow_the_file(tmp_path):
    run = tmp_path / "run" / "study"
    run.mkdir(parents=True)
    np.savez(run / "arrays.npz", x=np.arange(4.0))
    a = data.load_arrays(str(tmp_path), "run/study")
    assert a is data.load_arrays(str(tmp_path), "run/study")  # no copy per call
    with pytest.raises(ValueError):
        a["x"][0] = 7.0
    with pytest.raises(TypeError):
        a["y"] = np.zeros(1)  # type: ignore[index]
    np.savez(run / "arrays.npz", x=np.arange(5.0))
    st = os.stat(run / "arrays.npz")
    os.utime(run / "arrays.npz", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a rewrite within the clock tick
    assert data.load_arrays(str(tmp_path), "run/study")["x"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert dict(data.load_arrays(str(tmp_path), "run")) == {}  # no arrays.npz there
