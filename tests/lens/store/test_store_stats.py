"""The statistics a capture writes with its shards (lens.store.stats) equal those of the stored rows,
survive an interrupted capture resumed with --resume, and a split capture merged, and are refused when
damaged.

Tolerance: the reference is plain float64 numpy over each whole layer; the store adds per-shard sums of
1024-row blocks, so the two differ by float64 rounding only (relative 1e-9 is ~10^6 ulps of margin and
still far below any float16 rounding of the data, so a wrong token or group would fail).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import geometry
import lens
from lens.errors import LensInputError, StoreCorruptError, StoreWriteError
from lens.store import faults
from lens.store.parts import merge_stores
from lens.store.verify import verify_store

KW = dict(corpus="lee", max_tokens=600, seq_len=32, batch_size=2, shard_tokens=64, sites=["resid_post", "embed"],
          progress=False, dtype="float16")
RTOL = 1e-9


def reference(store, site, drop_special, min_pos):
    """Per layer (n, Σx, Σ‖x‖², Σû, Σû²) from the stored rows, float64, without lens.store.stats."""
    mask = store.mask(drop_special, min_pos)
    out = []
    for layer in store.layers(site) or [None]:
        X = store.get(site, layer, dtype=torch.float64).numpy()[mask]
        norms = np.linalg.norm(X, axis=1)
        U = X / norms[:, None]
        out.append((len(X), X.sum(0), (norms ** 2).sum(), U.sum(0), (U ** 2).sum(0)))
    return out


def assert_matches(st, ref):
    assert st.n == ref[0][0]
    for i, (n, s1, sq, su, su2) in enumerate(ref):
        np.testing.assert_allclose(st.mean[i], s1 / n, rtol=RTOL, atol=1e-12)
        np.testing.assert_allclose(st.sq_norm[i], sq, rtol=RTOL)
        np.testing.assert_allclose(st.su[i], su, rtol=RTOL, atol=1e-9)
        np.testing.assert_allclose(st.su2[i], su2, rtol=RTOL, atol=1e-12)


@pytest.fixture(scope="module")
def single(tiny_llama, tmp_path_factory):
    return lens.capture(tiny_llama, out=tmp_path_factory.mktemp("stats") / "single", **KW)


def _stats_bytes(store) -> dict:
    root = store.root if hasattr(store, "root") else store
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.glob("shards/*/stats.*.npy"))}


@pytest.mark.parametrize("drop_special,min_pos", [(True, 0), (True, 1), (False, 0), (False, 1), (True, 3)])
def test_recorded_stats_equal_the_stored_rows(single, drop_special, min_pos):
    assert single.has_stats("resid_post") and single.has_stats("embed")
    assert len(single.manifest["shards"]) > 3
    for site in ("resid_post", "embed"):
        st = single.stats(site, drop_special, min_pos)
        assert st.layers.tolist() == (single.layers(site) or [-1])
        assert_matches(st, reference(single, site, drop_special, min_pos))


def test_recorded_and_recomputed_agree_and_need_no_states(single, tmp_path):
    # the anisotropy profile from the recorded sums = the one geometry computes from the rows
    st = single.stats("resid_post", True, 1)
    prof = geometry.anisotropy_from_stats(st)
    rows = single.mask(True, 1)
    X = single.get("resid_post", 2, dtype=torch.float64)[torch.from_numpy(rows)]
    U = torch.nn.functional.normalize(X, dim=1)
    pairs = (U.sum(0) @ U.sum(0) - (U * U).sum()) / (len(U) * (len(U) - 1))
    assert prof.mean_cosine[2] == pytest.approx(float(pairs), rel=RTOL)
    # reading them touches no activation file: delete every one and the statistics still come
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(single.root, copy)
    for p in copy.glob("shards/*/resid_post.npy"):
        p.unlink()
    again = lens.open_store(copy).stats("resid_post", True, 1)
    np.testing.assert_array_equal(again.su, st.su)
    with pytest.raises(StoreCorruptError):  # ... while a statistic the shards do not hold needs them
        lens.open_store(copy).stats("resid_post", True, 2)


def test_in_memory_store_computes_the_same(tiny_llama, single):
    mem = lens.capture(tiny_llama, out=None, **KW)
    assert not mem.has_stats()
    assert_matches(mem.stats("resid_post", True, 1), reference(single, "resid_post", True, 1))


def test_resumed_capture_writes_the_same_statistics(tiny_llama, single, tmp_path, monkeypatch):
    out = tmp_path / "resumed"
    faults.reset()
    monkeypatch.setenv(faults.ENV, "shard.renamed@4=eio")  # the 4th shard renamed, never committed
    with pytest.raises(StoreWriteError):
        lens.capture(tiny_llama, out=out, **KW)
    monkeypatch.delenv(faults.ENV)
    faults.reset()
    partial = json.loads((out / "manifest.json").read_text())
    assert 0 < len(partial["shards"]) < len(single.manifest["shards"])
    resumed = lens.capture(tiny_llama, out=out, resume=True, **KW)
    assert _stats_bytes(resumed) == _stats_bytes(single)
    assert [s["stats"] for s in resumed.manifest["shards"]] == [s["stats"] for s in single.manifest["shards"]]
    a, b = resumed.stats("resid_post", False, 0), single.stats("resid_post", False, 0)
    np.testing.assert_array_equal(a.s1, b.s1)
    np.testing.assert_array_equal(a.su2, b.su2)


def test_merged_parts_have_the_statistics_of_one_capture(tiny_llama, single, tmp_path):
    parts = [lens.capture(tiny_llama, out=tmp_path / f"p{i}", part=f"{i}/2", **KW).root for i in (1, 2)]
    merged = lens.open_store(merge_stores(parts, tmp_path / "merged"))
    assert _stats_bytes(merged) == _stats_bytes(single)
    for drop_special, min_pos in ((True, 1), (False, 0)):
        a, b = merged.stats("resid_post", drop_special, min_pos), single.stats("resid_post", drop_special, min_pos)
        assert a.n == b.n
        np.testing.assert_array_equal(a.s1, b.s1)
        np.testing.assert_array_equal(a.su, b.su)
    # the parts' statistics add up to the merged store's (each part holds its own shards' sums)
    p1, p2 = (lens.open_store(p).stats("resid_post", True, 1) for p in parts)
    np.testing.assert_allclose(p1.su + p2.su, merged.stats("resid_post", True, 1).su, rtol=1e-12, atol=1e-12)


def test_damaged_statistics_are_refused(single, tmp_path):
    import shutil

    copy = tmp_path / "damaged"
    shutil.copytree(single.root, copy)
    victim = copy / "shards" / "00002" / "stats.resid_post.npy"
    raw = bytearray(victim.read_bytes())
    raw[-5] ^= 0x40
    victim.write_bytes(bytes(raw))
    with pytest.raises(StoreCorruptError, match="00002/stats.resid_post.npy: fails its checksum"):
        lens.open_store(copy).stats("resid_post")
    report = verify_store(copy)
    assert not report.ok and any("stats.resid_post.npy" in p for p in report.problems)
    assert verify_store(single.root).ok and not verify_store(single.root).warnings


def test_unknown_site_is_refused(single):
    with pytest.raises(LensInputError, match="'mlp_out' is not in this store"):
        single.stats("mlp_out")


def test_rows_are_read_shard_by_shard_in_any_order(single):
    rng = np.random.default_rng(0)
    rows = rng.integers(0, single.n_tokens, size=300)  # unordered, with repeats, across shards
    for layer, site in ((1, "resid_post"), (None, "embed")):
        whole = single.get(site, layer)
        assert torch.equal(single.get(site, layer, rows=rows), whole[torch.from_numpy(rows)])
        assert torch.equal(single.get(site, layer, rows=np.sort(np.unique(rows))),
                           whole[torch.from_numpy(np.sort(np.unique(rows)))])
    view = single.view("resid_post").astype(torch.float32).take(rows[:50])
    assert torch.equal(view[2], single.get(layer=2, dtype=torch.float32)[torch.from_numpy(rows[:50])])
    with pytest.raises(LensInputError, match="rows must lie in"):
        single.get(layer=0, rows=[single.n_tokens])
