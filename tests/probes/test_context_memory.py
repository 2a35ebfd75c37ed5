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
