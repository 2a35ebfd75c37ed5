"""Context memory probe: planted prefix information is read back where, and for whom, it was put."""

import numpy as np
import pytest

from probes.context_memory import ContextMemoryProbe, aggregate_by_class, previous_index


def _planted(n_docs=60, doc_len=40, vocab=50, de=8, seed=0):
    rng = np.random.default_rng(seed)
    E = rng.normal(size=(vocab, de))
    ids = rng.integers(0, vocab, n_docs * doc_len)
    docs = np.repeat(np.arange(n_docs), doc_len)
    pos = np.tile(np.arange(doc_len), n_docs)
    prev = previous_index(docs, pos, 3)
    T = E[ids]
    P = [np.where((prev[:, j] >= 0)[:, None], T[np.maximum(prev[:, j], 0)], 0.0) for j in range(3)]
    noise = lambda: 0.3 * rng.normal(size=(len(ids), 4 * de))
    layer0 = np.hstack([T, 0 * T, 0 * T, 0 * T]) + noise()                  # no context
    layer1 = np.hstack([T, P[0], P[1], 0 * T]) + noise()                    # the last two tokens
    filler = ids < 15
    layer2 = np.hstack([T] + [np.where(filler[:, None], p, 0.0) for p in P]) + noise()   # fillers hold 3
    return np.stack([layer0, layer1, layer2]).astype(np.float32), T, docs, pos, filler


def test_previous_index():
    prev = previous_index([0, 0, 0, 1, 1], [0, 1, 2, 0, 1], 2)
    assert prev.tolist() == [[-1, -1], [0, -1], [1, 0], [-1, -1], [3, -1]]


def test_context_memory_reads_back_what_was_planted():
    X, T, docs, pos, filler = _planted()
    r = ContextMemoryProbe(k=3).fit(X, T, docs, pos).result_
    assert abs(r.score[0]) < 0.05
    np.testing.assert_allclose(r.score_by_offset[1], [1, 1, 0], atol=0.1)
    assert r.token_scores.shape == (3, len(r.test_rows))
    names, by_class = aggregate_by_class(r.token_scores, np.where(filler[r.test_rows], "filler", "content"))
    f, c = names.index("filler"), names.index("content")
    assert by_class[2, f] > 0.8 and by_class[2, c] < 0.2
    assert abs(by_class[0, f] - by_class[0, c]) < 0.1
    assert np.all(np.isnan(r.token_scores[:, pos[r.test_rows] == 0]))


@pytest.mark.parametrize("change, match", [
    (lambda X, T, d, p: (X, T[:-1], d, p), "targets: expected 2400 rows"),
    (lambda X, T, d, p: (X, T, d[:-1], p), "docs: expected 2400"),
    (lambda X, T, d, p: (X, np.where(T > 2, np.nan, T), d, p), "targets: expected finite"),
    (lambda X, T, d, p: (X[:, :12], T[:12], d[:12], p[:12]), "at least 3 distinct documents"),
    (lambda X, T, d, p: (X[:, :30], T[:30], d[:30] * 0 + np.arange(30) // 2, p[:30] % 2), "with 3 predecessors"),
])
def test_context_memory_bad_input(change, match):
    X, T, docs, pos, _ = _planted()
    with pytest.raises(ValueError, match=match):
        ContextMemoryProbe(k=3).fit(*change(X, T, docs, pos))
    with pytest.raises(ValueError, match="k: expected"):
        ContextMemoryProbe(k=0).fit(X, T, docs, pos)


def test_context_memory_equals_a_plain_ridge_reference():
    """Choice of the ridge strength on validation RSS and the refit on train + validation (whose Gram
    and cross-products are assembled from the two sets' ones) against scikit-learn's Ridge."""
    from sklearn.linear_model import Ridge

    from probes.prediction_residual import DEFAULT_ALPHAS, split_documents

    X, T, docs, pos, _ = _planted(n_docs=30)
    T = T + 1.0                                                   # targets off zero: the intercept matters
    probe = ContextMemoryProbe(k=2, norm="rms").fit(X, T, docs, pos)
    r = probe.result_
    prev = previous_index(docs, pos, 2)
    codes = np.unique(docs, return_inverse=True)[1]
    split = split_documents(codes, codes.max() + 1, 0.2, 0.2, 0)[codes]
    full = (prev >= 0).all(1)
    tr, va = (np.flatnonzero(full & (split == s)) for s in (0, 1))
    Y = np.hstack([T[np.maximum(prev[:, j], 0)] for j in range(2)])
    for i in range(3):
        x = X[i].astype(np.float64)
        x = x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-5)
        xc = x[tr] - x[tr].mean(0)
        mean_ev = np.trace(xc.T @ xc) / x.shape[1]
        val = [((Ridge(alpha=a * mean_ev).fit(x[tr], Y[tr]).predict(x[va]) - Y[va]) ** 2).sum()
               for a in DEFAULT_ALPHAS]
        assert r.alpha_relative[i] == DEFAULT_ALPHAS[int(np.argmin(val))]
        tv = np.concatenate([tr, va])
        xc = x[tv] - x[tv].mean(0)
        lam = r.alpha_relative[i] * np.trace(xc.T @ xc) / x.shape[1]
        pred = Ridge(alpha=lam).fit(x[tv], Y[tv]).predict(x[r.test_rows])
        for j in range(2):
            ok = prev[r.test_rows, j] >= 0
            tj = Y[r.test_rows][ok, j * T.shape[1]:(j + 1) * T.shape[1]]
            v = ((tj - tj.mean(0)) ** 2).sum(1).mean()
            want = 1 - ((pred[ok, j * T.shape[1]:(j + 1) * T.shape[1]] - tj) ** 2).sum(1) / v
            np.testing.assert_allclose(r.score_by_offset[i, j], want.mean(), rtol=1e-9)
