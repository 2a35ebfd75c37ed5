"""geometry.nearest: known answers (a line, duplicates, ties), equality with brute force in float64 and
with scikit-learn, and a real tiny-llama store's neighbours and contexts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import geometry
from lens.errors import LensInputError

CHUNKS = (1, 3, 37, 4096)


def brute(X: np.ndarray, queries, k: int, metric: str, eligible=None, exclude_self=True):
    """The reference: every distance directly in float64, sorted by (distance, row)."""
    X = np.asarray(X, dtype=np.float64)
    keep = np.ones(len(X), bool) if eligible is None else eligible
    rows, dists = [], []
    for q in np.atleast_1d(queries):
        if metric == "cosine":
            norms = np.linalg.norm(X, axis=1)
            U = X / np.where(norms > 0, norms, 1.0)[:, None]
            d = np.clip(1.0 - (U * U[q]).sum(axis=1), 0.0, 2.0)
        else:
            d = np.sqrt(((X - X[q]) ** 2).sum(axis=1))
        ok = keep.copy()
        if exclude_self:
            ok[q] = False
        cand = np.nonzero(ok)[0]
        order = cand[np.lexsort((cand, d[cand]))][:k]
        rows.append(order), dists.append(d[order])
    return np.array(rows), np.array(dists)


def test_points_on_a_line():
    X = torch.tensor([[0.0], [1.0], [2.0], [3.0], [-1.0], [5.0]])
    for c in CHUNKS:
        r = geometry.nearest(X, 0, 4, metric="euclidean", chunk_size=c)
        np.testing.assert_array_equal(r.rows, [[1, 4, 2, 3]])  # 1 and 4 tie at 1: the lower row first
        np.testing.assert_array_equal(r.distances, [[1.0, 1.0, 2.0, 3.0]])
        assert r.metric == "euclidean" and r.k == 4 and r.rows.dtype == np.int64 and r.distances.dtype == np.float64
    r = geometry.nearest(X, [3, 5], 2, metric="euclidean")
    np.testing.assert_array_equal(r.rows, [[2, 1], [3, 2]])
    np.testing.assert_array_equal(r.queries, [3, 5])


def test_duplicates_and_the_query_itself():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 8)).astype(np.float32)
    X[[10, 40]] = X[3]
    X[[20, 45]] = X[5]
    for metric in geometry.METRICS:
        for c in CHUNKS:
            r = geometry.nearest(X, 3, 2, metric=metric, chunk_size=c)
            np.testing.assert_array_equal(r.rows, [[10, 40]])
            np.testing.assert_array_equal(r.distances, [[0.0, 0.0]])
            r = geometry.nearest(X, 3, 3, metric=metric, exclude_self=False, chunk_size=c)
            np.testing.assert_array_equal(r.rows, [[3, 10, 40]])
        # rows 5, 20, 45 are one point: equal distances to any query, bit for bit, in row order
        q = int(np.nonzero(brute(X, 0, 49, metric)[0][0] == 5)[0][0])  # rank of row 5 from query 0
        for c in CHUNKS:
            r = geometry.nearest(X, 0, 49, metric=metric, chunk_size=c)
            np.testing.assert_array_equal(r.rows[0, q : q + 3], [5, 20, 45])
            assert r.distances[0, q] == r.distances[0, q + 1] == r.distances[0, q + 2]


def test_cosine_ignores_scale_and_zero_rows_sit_at_one():
    X = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [-1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    r = geometry.nearest(X, 0, 5)
    np.testing.assert_array_equal(r.rows, [[1, 5, 2, 4, 3]])
    np.testing.assert_allclose(r.distances, [[0.0, 1 - 2**-0.5, 1.0, 1.0, 2.0]], atol=1e-15)


@pytest.mark.parametrize("metric", geometry.METRICS)
@pytest.mark.parametrize("shape", ["plain", "offset", "rogue"])
def test_equals_brute_force(metric, shape):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(700, 48)).astype(np.float32)
    if shape == "offset":  # a large common offset: all cosines near 1, squared norms near 1e8
        X += np.float32(1e3)
    elif shape == "rogue":  # one dimension dwarfs the rest (Timkey & van Schijndel 2021)
        X[:, 7] = X[:, 7] * 50 + 200
    eligible = rng.random(700) < 0.8
    queries = [0, 17, 699, 350]
    ref_rows, ref_d = brute(X, queries, 25, metric, eligible)
    for c in (37, 256, 100_000):
        r = geometry.nearest(torch.from_numpy(X), queries, 25, metric=metric, eligible=eligible, chunk_size=c)
        np.testing.assert_array_equal(r.rows, ref_rows)
        np.testing.assert_allclose(r.distances, ref_d, rtol=1e-12, atol=1e-15)
        np.testing.assert_array_equal(r.n_candidates, eligible.sum() - eligible[queries])
    # eligible as row indices means the same
    r = geometry.nearest(X, queries, 25, metric=metric, eligible=np.nonzero(eligible)[0])
    np.testing.assert_array_equal(r.rows, ref_rows)


@pytest.mark.parametrize("metric", geometry.METRICS)
def test_equals_scikit_learn_brute(metric):
    from sklearn.neighbors import NearestNeighbors

    rng = np.random.default_rng(2)
    X = rng.normal(size=(900, 32))
    X[:, 3] *= 30  # a rogue dimension
    queries = [5, 100, 899]
    nn = NearestNeighbors(n_neighbors=11, algorithm="brute", metric=metric).fit(X)
    d, i = nn.kneighbors(X[queries])  # the query itself comes first, at distance 0
    r = geometry.nearest(X, queries, 10, metric=metric, chunk_size=128)
    np.testing.assert_array_equal(i[:, 0], queries)
    np.testing.assert_array_equal(r.rows, i[:, 1:])
    np.testing.assert_allclose(r.distances, d[:, 1:], rtol=1e-9, atol=1e-12)


def test_half_precision_states_are_compared_in_float64():
    rng = np.random.default_rng(3)
    X = torch.from_numpy(rng.normal(size=(300, 16)).astype(np.float32))
    for dtype in (torch.float16, torch.bfloat16):
        Xh = X.to(dtype)
        r = geometry.nearest(Xh, [4, 9], 12, metric="euclidean", chunk_size=50)
        rows, d = brute(Xh.to(torch.float64).numpy(), [4, 9], 12, "euclidean")
        np.testing.assert_array_equal(r.rows, rows)
        np.testing.assert_allclose(r.distances, d, rtol=1e-12)


def test_bad_input_says_what_was_expected():
    X = torch.randn(20, 4)
    cases = [
        (dict(queries=0, k=20), "only 19 eligible rows"),
        (dict(queries=0, k=3, eligible=np.arange(20) < 3), "only 2 eligible rows"),
        (dict(queries=0, k=0), "k must be a positive integer"),
        (dict(queries=20, k=2), "rows 0..19"),
        (dict(queries=[], k=2), "one row index or a list"),
        (dict(queries=0.5, k=2), "one row index or a list"),
        (dict(queries=0, k=2, metric="manhattan"), "cosine, euclidean"),
        (dict(queries=0, k=2, eligible=np.ones(5, bool)), "boolean mask of 20 rows"),
        (dict(queries=0, k=2, chunk_size=0), "chunk_size"),
    ]
    for kw, text in cases:
        with pytest.raises(LensInputError, match=text):
            geometry.nearest(X, **kw)
    Z = X.clone()
    Z[0] = 0
    with pytest.raises(LensInputError, match="non-zero norm"):
        geometry.nearest(Z, 0, 2)
    assert geometry.nearest(Z, 0, 2, metric="euclidean").k == 2
    Z[5, 1] = float("nan")
    with pytest.raises(LensInputError, match="1 eligible rows hold NaN"):
        geometry.nearest(Z, 1, 2)
    assert 5 not in geometry.nearest(Z, 1, 2, eligible=np.arange(20) != 5).rows
    with pytest.raises(LensInputError, match="query rows must hold finite"):
        geometry.nearest(Z, 5, 2, metric="euclidean")
    with pytest.raises(LensInputError, match="2-D"):
        geometry.nearest(torch.randn(5), 0, 2)


# ------------------------------------------------------------------ a real store
@pytest.fixture(scope="module")
def tiny_store(tiny_llama):
    import lens

    return lens.capture(tiny_llama, corpus="lee", max_tokens=600, seq_len=48, sites=["resid_post", "embed"],
                        progress=False)


@pytest.mark.parametrize("metric", geometry.METRICS)
def test_neighbours_in_a_real_store(tiny_store, metric):
    store = tiny_store
    mask = store.mask(drop_special=True, min_pos=1)
    view = store.view("resid_post")
    queries = [5, 100, 333]
    for layer in (0, 2):
        r = geometry.nearest(view, queries, 8, layer=layer, metric=metric, eligible=mask, chunk_size=100)
        rows, d = brute(store.get(layer=layer).numpy(), queries, 8, metric, mask)
        np.testing.assert_array_equal(r.rows, rows)
        np.testing.assert_allclose(r.distances, d, rtol=1e-12, atol=1e-15)
        assert mask[r.rows].all() and not np.isin(r.rows, queries).any()
    # a view taken over rows indexes those rows; one layer needs no layer=
    sub = store.view("resid_post", layers=[1]).take(mask)
    r = geometry.nearest(sub, [0, 1], 5, metric=metric)
    rows, _ = brute(store.get(layer=1).numpy()[mask], [0, 1], 5, metric)
    np.testing.assert_array_equal(r.rows, rows)
    with pytest.raises(LensInputError, match="expected layer="):
        geometry.nearest(view, 0, 3)
    # embed, at the input: tokens with the same id have the same state, so a token's nearest are its copies
    emb = geometry.nearest(store.view("embed"), 5, 3, metric=metric, eligible=mask)
    same = np.nonzero(mask & (store.tokens["token_id"] == store.tokens["token_id"][5]))[0]
    same = same[same != 5]
    if len(same):
        np.testing.assert_array_equal(emb.rows[0, : min(3, len(same))], same[:3])
        assert (emb.distances[0, : min(3, len(same))] == 0).all()


def test_contexts_of_the_neighbours(tiny_store):
    store = tiny_store
    tok = store.tokens
    r = geometry.nearest(store.view("resid_post"), 100, 6, layer=3, eligible=store.mask(min_pos=1))
    for row, ctx in zip(r.rows[0], store.contexts(r.rows[0], width=5)):
        assert ctx.row == row and ctx.token == tok["token"][row] and ctx.rows[ctx.at] == row
        assert (tok["window"][ctx.rows] == tok["window"][row]).all() and (tok["doc"][ctx.rows] == tok["doc"][row]).all()
        assert len(ctx.rows) == min(ctx.pos, 5) + 1 + min(5, (tok["window"] == tok["window"][row]).sum() - ctx.pos - 1)
        assert ctx.marked() == "".join(tok["token"][ctx.rows[: ctx.at]]) + "⟦" + tok["token"][row] + "⟧" + \
            "".join(tok["token"][ctx.rows[ctx.at + 1:]])
