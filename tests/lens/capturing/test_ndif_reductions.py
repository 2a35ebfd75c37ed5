"""NDIF reductions: statistics and position subsets computed inside the nnsight trace, sized before sending.

Run through nnsight's local execution (``select=True``) and through its dry run of a remote request
(``remote="local"``: the block is serialised, lens is hidden, the block is deserialised and run),
since NDIF cannot be reached from a test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import geometry
import lens
from lens.capturing.backends.native import NativeBackend
from lens.capturing.backends.nnsight_backend import NNsightBackend
from lens.capturing.backends.server_side import MOMENTS, MOMENTS_COV, ROWS
from lens.capturing.collect import collect_positions, collect_stats
from lens.errors import LensInputError
from lens.store.layer_stats import LayerStats, from_sums, load_stats, merge, save_stats
from lens.store.positions import select_positions
from lens.sites import HookSite, Site

HOOKS = [HookSite(Site.EMBED, None), HookSite(Site.RESID_POST, 1), HookSite(Site.RESID_POST, 3)]
CAPTURE = dict(corpus="wiki-sample", sites=["resid_post"], layers="all", max_tokens=240, seq_len=32, batch_size=3)


@pytest.fixture(scope="module")
def batch():
    ids = torch.randint(5, 1000, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # right padding
    mask[2, :4] = 0  # left padding
    return ids, mask


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return NNsightBackend(tiny_llama, HOOKS, select=True)


@pytest.fixture(scope="module")
def native(tiny_llama, batch):
    return NativeBackend(tiny_llama, HOOKS).run(*batch)[0]


@pytest.fixture(scope="module")
def store(tiny_llama):
    return lens.capture(tiny_llama, **CAPTURE, progress=False)


@pytest.fixture(scope="module")
def run(tiny_llama):
    return collect_stats(tiny_llama, **CAPTURE, progress=False)


def _reference(X: np.ndarray) -> dict:
    X = X.astype(np.float64)
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    return dict(mean=X.mean(0), cov=np.cov(X, rowvar=False), sq_norm=(X * X).sum(), su=U.sum(0), su2=(U * U).sum(0))


def _close(got, want, tol=1e-5):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max())))


def test_positions_count_real_tokens_on_either_side_of_the_padding(batch):
    _, mask = batch  # real lengths 12, 7, 8 (the third left-padded by 4)
    sel = select_positions(mask, [0, 7, -1])
    assert sel.seq.tolist() == [0, 0, 0, 1, 1, 2, 2] and sel.n == 7  # row 2's position 7 is its last: once
    want = [(0, 0), (0, 7), (0, 11), (1, 0), (1, 6), (2, 4), (2, 11)]  # (sequence, column); 7 is past row 1's end
    assert [(int(i) // 12, int(i) % 12) for i in sel.index] == want
    assert sel.pos.tolist() == [0, 7, 11, 0, 6, 0, 7]
    last = select_positions(mask, "last")
    assert [int(i) % 12 for i in last.index] == [11, 6, 11] and last.pos.tolist() == [11, 6, 7]
    assert select_positions(mask, "all").n == int(mask.sum())
    with pytest.raises(LensInputError, match="positions must be 'all', 'last' or integers"):
        select_positions(mask, "first")


def test_server_statistics_equal_the_native_states(engine, native, batch):
    ids, mask = batch
    got, sel = engine.run_stats(ids, mask, "all", cov=True)
    keep = mask.bool()
    for h in HOOKS:
        st = from_sums(h.site.value, [h.layer or 0], sel.n, [got[h.key][0]], [got[h.key][1]])
        ref = _reference(native[h.key][keep].numpy())
        assert st.n == int(keep.sum())
        _close(st.mean[0], ref["mean"])
        _close(st.cov[0], ref["cov"])
        _close(st.sq_norm[0], ref["sq_norm"])
        _close(st.su[0], ref["su"])
        _close(st.su2[0], ref["su2"])
        assert st.n_zero[0] == 0


def test_statistics_at_positions_equal_the_states_there(engine, native, batch):
    ids, mask = batch
    got, sel = engine.run_stats(ids, mask, "last", cov=False)
    rows, _ = engine.run_rows(ids, mask, "last")
    for h in HOOKS:
        want = native[h.key].reshape(-1, native[h.key].shape[-1])[sel.index]
        torch.testing.assert_close(rows[h.key], want, atol=1e-5, rtol=0)
        st = from_sums(h.site.value, [0], sel.n, [got[h.key][0]], None)
        _close(st.mean[0], want.double().mean(0).numpy())
        assert not st.has_cov


def test_batches_merge_to_one_batch(engine, batch):
    ids, mask = batch
    whole, sel = engine.run_stats(ids, mask, "all", cov=True)
    key = HOOKS[1].key
    one = from_sums("resid_post", [1], sel.n, [whole[key][0]], [whole[key][1]])
    merged = None
    for i in range(ids.shape[0]):
        got, s = engine.run_stats(ids[i:i + 1], mask[i:i + 1], "all", cov=True)
        part = from_sums("resid_post", [1], s.n, [got[key][0]], [got[key][1]])
        merged = part if merged is None else merge(merged, part)
    assert merged.n == one.n
    for name in ("mean", "cov", "sq_norm", "su", "su2"):
        _close(getattr(merged, name), getattr(one, name))


def test_merge_is_exact_algebra_on_synthetic_rows():
    """Known answer: sums of float64 rows far from the origin, split unevenly, merge to the whole's."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 6)) * [1, 2, 3, 0.1, 5, 1] + 1000.0

    def stats(R):
        U = R / np.linalg.norm(R, axis=1, keepdims=True)
        shift = R.mean(0)
        Z = R - shift
        block = np.stack([shift, Z.sum(0), U.sum(0), (U * U).sum(0), np.r_[(R * R).sum(), 0, 0, 0, 0, 0]])
        return from_sums("resid_post", [0], len(R), [block], [(Z.T @ Z)[np.triu_indices(6)]])

    parts = [stats(X[a:b]) for a, b in ((0, 7), (7, 300), (300, 500))]
    total = merge(merge(parts[0], parts[1]), parts[2])
    np.testing.assert_allclose(total.mean[0], X.mean(0), rtol=1e-12)
    np.testing.assert_allclose(total.cov[0], np.cov(X, rowvar=False), rtol=1e-9)
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    np.testing.assert_allclose(total.mean_cosine[0], ((U.sum(0) @ U.sum(0)) - 500) / (500 * 499), rtol=1e-12)


def test_anisotropy_from_stats_equals_geometry_on_the_captured_store(run, store):
    st = run.stats["resid_post"]
    assert st.n == store.n_tokens and st.layers.tolist() == store.layers("resid_post")
    states = store.view("resid_post").astype(torch.float32).load()
    want = geometry.anisotropy_by_layer([states[l] for l in st.layers], layers=st.layers)
    got = geometry.anisotropy_from_stats(st)
    _close(got.mean_cosine, want.mean_cosine)
    _close(got.cosine_contributions, want.cosine_contributions)
    _close(got.top_pc_share, want.top_pc_share)
    _close(got.top_pc_share_adjusted, want.top_pc_share_adjusted)
    np.testing.assert_array_equal(got.rogue_dims, want.rogue_dims)
    _close(got.rogue_share, want.rogue_share)
    assert np.isnan(got.self_similarity).all()  # needs word labels: not a sum over tokens
    for l in st.layers:
        X = states[l].double().numpy()
        _close(st.at(l).mean[0], X.mean(0))
        _close(st.at(l).cov[0], np.cov(X, rowvar=False))


def test_position_subsets_equal_slicing_the_full_capture(tiny_llama, store):
    got = collect_positions(tiny_llama, **CAPTURE, positions=[0, 5, -1], progress=False)
    tok = store.tokens
    n_real = np.bincount(tok["window"])[tok["window"]]
    want = (tok["pos"] == 0) | (tok["pos"] == 5) | (tok["pos"] == n_real - 1)
    rows = np.nonzero(want)[0]
    np.testing.assert_array_equal(got.tokens["token_id"], tok["token_id"][rows])
    np.testing.assert_array_equal(got.tokens["window"], tok["window"][rows])
    for l in store.layers("resid_post"):
        key = HookSite(Site.RESID_POST, l).key
        torch.testing.assert_close(got.states[key], store.get(layer=l, site="resid_post")[rows], atol=1e-5, rtol=0)
    assert got.bytes_back == got.bytes_estimated == len(rows) * 4 * tiny_llama.d_model * 4


@pytest.mark.parametrize("reduction", [ROWS, MOMENTS, MOMENTS_COV])
def test_the_estimate_is_the_bytes_that_came_back(engine, batch, tiny_llama, reduction):
    ids, mask = batch
    if reduction == ROWS:
        _, sel = engine.run_rows(ids, mask, [1, -2])
    else:
        _, sel = engine.run_stats(ids, mask, "all", cov=reduction == MOMENTS_COV)
    assert engine.estimate_bytes(sel.n, reduction) == engine.last_bytes
    d = tiny_llama.d_model
    per_site = {ROWS: sel.n * d * 4, MOMENTS: 5 * d * 8, MOMENTS_COV: 5 * d * 8 + d * (d + 1) // 2 * 4}[reduction]
    assert engine.last_bytes == len(HOOKS) * per_site


def test_requests_over_the_limit_are_refused_with_what_fits(engine, batch, monkeypatch):
    ids, mask = batch
    cov = engine.estimate_bytes(0, MOMENTS_COV)
    monkeypatch.setenv("LENS_NDIF_MAX_MB", str(cov / 2**20 * 0.7))
    with pytest.raises(LensInputError, match=r"at most 2 of the 3 sites fit in one request; without the covariance "
                                             r"\(--no-cov\)"):
        engine.run_stats(ids, mask, "all", cov=True)
    engine.run_stats(ids, mask, "all", cov=False)  # fits
    monkeypatch.setenv("LENS_NDIF_MAX_MB", str(engine.estimate_bytes(3, ROWS) / 2**20))
    with pytest.raises(LensInputError, match=r"use --batch-size 1 or fewer"):
        engine.run_rows(ids, mask, [0, 1])  # 6 rows: twice the limit
    engine.run_rows(ids, mask, "last")  # 3 rows fit


def test_the_block_survives_nnsights_dry_run_of_a_remote_request(tiny_llama, engine, batch):
    """remote="local": serialised as for NDIF, deserialised with lens hidden, then run."""
    ids, mask = batch
    sim = NNsightBackend(tiny_llama, HOOKS, remote="local")
    want, sel = engine.run_stats(ids, mask, [0, -1], cov=True)
    got, sel2 = sim.run_stats(ids, mask, [0, -1], cov=True)
    assert torch.equal(sel.index, sel2.index)
    for k in want:
        torch.testing.assert_close(got[k][0], want[k][0])
        torch.testing.assert_close(got[k][1], want[k][1])
    states, _ = sim.run(ids, mask)
    for k, v in engine.run(ids, mask)[0].items():
        torch.testing.assert_close(states[k], v)


def test_stats_round_trip_and_refuse_what_was_not_collected(run, tmp_path):
    path = save_stats(run.stats, tmp_path / "stats.npz")
    back = load_stats(path)
    st = back["resid_post"]
    assert isinstance(st, LayerStats) and st.n == run.stats["resid_post"].n
    np.testing.assert_array_equal(st.s2, run.stats["resid_post"].s2)
    light = LayerStats(**{**st.__dict__, "s2": None})
    with pytest.raises(LensInputError, match="collected without the covariance"):
        light.cov
    assert np.isnan(geometry.anisotropy_from_stats(light).top_pc_share).all()
    with pytest.raises(LensInputError, match="layer 9 is not in the resid_post statistics"):
        st.at(9)


def test_cli_writes_npz_and_json(tmp_path):
    from app.commands.cli import main

    out = tmp_path / "stats"
    rc = main(["stats", "tiny-llama", "--corpus", "wiki-sample", "--max-tokens", "96", "--seq-len", "32",
               "--layers", "1,3", "--positions", "last", "--no-cov", "--out", str(out), "--quiet"])
    assert rc == 0
    record = json.loads((out / "stats.json").read_text())
    site = record["sites"]["resid_post"]
    assert site["layers"] == [1, 3] and site["top_pc_share"] is None and len(site["mean_cosine"]) == 2
    assert record["positions"] == [-1] and record["cov"] is False
    assert record["n_tokens"] == load_stats(out / "stats.npz")["resid_post"].n == 3  # 96 tokens in 3 windows
    assert record["bytes_back"] == record["bytes_estimated"] == record["n_requests"] * 2 * 5 * 64 * 8
