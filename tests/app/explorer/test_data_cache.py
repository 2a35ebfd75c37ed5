"""The explorer's shared result arrays (app/explorer/data.py): one read-only copy per file version, read again when
the file changes (a study rerun while the explorer is open), none for a folder without arrays."""

from __future__ import annotations

import os

import numpy as np
import pytest

from app.explorer import data


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


def test_nearest_answers_are_kept_per_query_and_store_seal(tmp_path, monkeypatch):
    """The Token view and the Nearest page ask through ``app.explorer.nearest.answer``: a query asked again is
    not searched again; another row, k or store seal (a store captured again in the folder) is."""
    import lens
    from app.explorer import nearest

    lens.capture("tiny-llama", corpus="wiki-sample", sites=["resid_post"], max_tokens=64, seq_len=32,
                 out=tmp_path / "store", progress=False)
    asked = []
    real = nearest.ask

    def counting(*args, **kw):
        asked.append(args[4])
        return real(*args, **kw)

    monkeypatch.setattr(nearest, "ask", counting)
    nearest.answer.clear()
    q = (str(tmp_path), "store", "seal-1", "resid_post", 1, 5, 5, "cosine", "cpu", False, 4)
    first = nearest.answer(*q)
    again = nearest.answer(*q)
    assert asked == [5] and again.found.rows.tolist() == first.found.rows.tolist()
    assert len(first.contexts) == 5 and 5 not in first.found.rows[0].tolist()
    nearest.answer(*q[:4], 1, 6, *q[6:])  # another row
    nearest.answer(*q[:2], "seal-2", *q[3:])  # the store captured again
    assert asked == [5, 6, 5]
