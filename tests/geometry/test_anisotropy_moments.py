"""The one-pass anisotropy (geometry.moments, float32) against the plain float64 formulas composed
by hand (post-process, then each measure), on synthetic data; and known answers."""

import itertools

import numpy as np
import pytest
import torch

import geometry
from geometry.anisotropy import intra_sentence_similarity, mean_cosine, mev, self_similarity, top_pc_share
from geometry.outliers import cosine_contributions


def structured(n=800, d=40, seed=0, offset=40.0):
    """Word centres + context drift + a rogue dimension + a large common offset (centring must not
    cancel the variance away in float32)."""
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 60, size=n)
    sentences = np.repeat(np.arange(n // 25), 25)
    centres = rng.normal(size=(60, d)) * 2
    drift = rng.normal(size=(n // 25, d))
    X = offset + centres[words] + drift[sentences] + rng.normal(size=(n, d))
    X[:, 3] += 25.0
    return X, words, sentences


def naive(X, pp, words, sentences, k=3, min_count=2, max_words=40, seed=0):
    """Each measure on a float64 post-processed copy, drawing the random baselines as anisotropy() does."""
    T = geometry.postprocess(X, pp, k=k)
    rng = np.random.default_rng(seed)
    w = np.unique(words, return_inverse=True)[1]
    s = np.unique(sentences, return_inverse=True)[1]
    w_perm, s_perm = rng.permutation(w), rng.permutation(s)
    n, d = T.shape
    share = top_pc_share(T)
    cc = cosine_contributions(T)
    mc = mean_cosine(T)
    ss = self_similarity(T, w, min_count)
    m = mev(T, w, min_count, max_words, seed)
    mc_ = mev(T, w, min_count, max_words, seed, centred=True)
    isim = intra_sentence_similarity(T, s)
    order = np.argsort(-cc, kind="stable")[:k]
    return dict(mean_cosine=mc, top_pc_share=share, top_pc_share_adjusted=share - (1 + np.sqrt(d / (n - 1))) ** 2 / d,
                self_similarity=ss, self_similarity_adjusted=ss - mc, intra_sentence_similarity=isim,
                intra_sentence_similarity_adjusted=isim - intra_sentence_similarity(T, s_perm), mev=m,
                mev_adjusted=m - mev(T, w_perm, min_count, max_words, seed), mev_centred=mc_,
                mev_centred_adjusted=mc_ - mev(T, w_perm, min_count, max_words, seed, centred=True), rogue_dims=order,
                rogue_share=float(cc[order].sum() / cc.sum()), cosine_contributions=cc)


@pytest.mark.parametrize("offset", [0.0, 40.0])
def test_one_pass_equals_the_float64_formulas_under_every_postprocessing(offset):
    X, words, sentences = structured(offset=offset)
    layers = [X, X * 0.5 + np.random.default_rng(1).normal(size=X.shape)]
    profs = geometry.anisotropy_profiles(layers, geometry.POSTPROCESSING, words=words, sentences=sentences,
                                         max_words=40)
    for li, L in enumerate(layers):
        for pp in geometry.POSTPROCESSING:
            ref = naive(L, pp, words, sentences)
            got = profs[pp]
            for name, want in ref.items():
                val = getattr(got, name)[li]
                if name == "rogue_dims":
                    np.testing.assert_array_equal(val, want, err_msg=f"{pp} {name}")
                else:
                    np.testing.assert_allclose(val, want, rtol=2e-4, atol=2e-5, err_msg=f"layer {li} {pp} {name}")


def test_single_layer_api_and_by_layer_agree_with_profiles():
    X, words, sentences = structured(n=600, d=24)
    a = geometry.anisotropy(X, words=words, sentences=sentences)
    p = geometry.anisotropy_by_layer([X], words=words, sentences=sentences, postprocessing="whiten")
    q = geometry.anisotropy_profiles([X], ("raw", "whiten"), words=words, sentences=sentences)
    assert a.mean_cosine == pytest.approx(q["raw"].mean_cosine[0], abs=1e-12)
    np.testing.assert_allclose(p.top_pc_share, q["whiten"].top_pc_share, atol=1e-12)


def test_known_answers_rank_one_and_whitened_isotropy():
    rng = np.random.default_rng(2)
    v = rng.normal(size=32)
    X = rng.uniform(1, 3, size=(400, 1)) * v  # every row points along v
    a = geometry.anisotropy(X, words=rng.integers(0, 10, 400), sentences=np.repeat(np.arange(20), 20))
    assert a.mean_cosine == pytest.approx(1.0, abs=1e-6)
    assert a.top_pc_share == pytest.approx(1.0, abs=1e-5)
    assert a.self_similarity == pytest.approx(1.0, abs=1e-6) and a.mev == pytest.approx(1.0, abs=1e-5)
    # whitening a full-rank Gaussian with any covariance leaves an isotropic cloud: top-PC share 1/d
    Y = rng.normal(size=(3000, 16)) @ rng.normal(size=(16, 16)) + 5.0
    w = geometry.anisotropy_by_layer([Y], postprocessing="whiten")
    assert w.top_pc_share[0] == pytest.approx(1 / 16, rel=1e-3)  # the whitening floor shrinks small λ a little
    assert abs(w.mean_cosine[0]) < 0.01


def test_float32_torch_input_and_zero_rows():
    X, words, sentences = structured(n=400, d=16)
    a = geometry.anisotropy(torch.tensor(X, dtype=torch.float32), words=words)
    b = geometry.anisotropy(X, words=words)
    assert a.self_similarity == pytest.approx(b.self_similarity, rel=1e-5)
    Z = X.copy()
    Z[5] = 0.0
    with pytest.raises(ValueError, match="zero vectors"):
        geometry.anisotropy(Z)


@pytest.mark.parametrize("d", [24, 512])
def test_batched_mev_equals_the_per_word_loop_and_its_shuffled_baseline(d):
    """geometry._mev lays the sample out by group size (real and shuffled groups together); its
    values equal geometry.anisotropy.mev, one float64 eigvalsh per word type, for both: to float64
    rounding when no group has more occurrences than dimensions (d=512), to float32 rounding of the
    few larger groups' σ₁² otherwise (d=24)."""
    from geometry._groups import Groups
    from geometry._mev import mev_pair

    rng = np.random.default_rng(5)
    n = 1500
    words = rng.zipf(1.4, size=n) % 200  # a long tail: group sizes from 2 to more than 24
    X = rng.normal(size=(n, d)) + rng.normal(size=(200, d))[words] * 2 + 3.0
    big = max(m for m, _, _ in Groups(n, words, min_count=2, max_words=None).mev.blocks)
    assert (big > d) == (d == 24)
    rel = 1e-6 if big > d else 1e-12
    for min_count, max_words in ((2, None), (3, 25), (2, 7)):
        g = Groups(n, words, min_count=min_count, max_words=max_words, seed=4)
        lay = g.mev
        sizes = [m for m, _, _ in lay.blocks]
        assert sizes == sorted(set(sizes)) and lay.rows.shape == (2 * sum(m * len(i) for m, i, _ in lay.blocks),)
        for dtype, centred in itertools.product((torch.float64, torch.float32), (False, True)):
            got, got_shuffled = mev_pair(torch.from_numpy(X[lay.rows]).to(dtype), lay, centred=centred)
            Xd = torch.from_numpy(X).to(dtype).double()  # the reference on the same (rounded) rows
            w_perm = np.random.default_rng(4).permutation(np.unique(words, return_inverse=True)[1])
            assert got == pytest.approx(mev(Xd, words, min_count, max_words, seed=4, centred=centred), rel=rel)
            assert got_shuffled == pytest.approx(mev(Xd, w_perm, min_count, max_words, seed=4, centred=centred),
                                                 rel=rel)


def test_mev_of_groups_larger_than_d_per_group():
    """σ₁²/Σσ² of one group with more occurrences than dimensions, against numpy's float64 SVD."""
    from geometry._mev import mev_layout, mev_pair

    rng = np.random.default_rng(8)
    codes = np.repeat([0, 1], [40, 3])
    W = rng.normal(size=(43, 6)) + np.array([5.0, 0, 0, 1, 0, 0])  # a dominant direction
    lay = mev_layout(codes, codes.copy(), min_count=2, max_words=None, seed=0)
    got = mev_pair(torch.from_numpy(W[lay.rows]).float(), lay)[0]
    W32 = W.astype(np.float32).astype(np.float64)
    want = np.mean([(s[0] ** 2) / (s ** 2).sum() for s in (np.linalg.svd(W32[:40], compute_uv=False),
                                                             np.linalg.svd(W32[40:], compute_uv=False))])
    assert got == pytest.approx(want, rel=1e-6)


def test_mev_occurrence_cap_samples_frequent_types_and_matches_the_reference():
    """``max_occurrences``: a frequent type's rows are a seeded random subset of that size (sorted, a
    subset of its rows), rarer types keep all theirs, the shuffled twins are capped to the same sizes,
    and the batched MEV equals the float64 reference with the same cap."""
    from geometry._groups import Groups
    from geometry._mev import mev_groups, mev_pair

    rng = np.random.default_rng(11)
    n, d = 2000, 32  # capped groups (20) below d: the float64 path on both sides
    words = rng.zipf(1.3, size=n) % 150
    counts = np.bincount(words)
    X = rng.normal(size=(n, d)) + rng.normal(size=(150, d))[words] * 2 + 3.0
    full = mev_groups(words, 2, None, 3)
    capped = mev_groups(words, 2, None, 3, max_occurrences=20)
    assert len(full) == len(capped) and max(map(len, full)) > 20
    for f, c in zip(full, capped):
        assert len(c) == min(len(f), 20) and set(c) <= set(f) and np.all(np.diff(c) > 0)
        assert np.all(words[c] == words[f[0]])
        if len(f) <= 20:
            assert np.array_equal(f, c)
    assert all(np.array_equal(a, b) for a, b in zip(capped, mev_groups(words, 2, None, 3, max_occurrences=20)))
    g = Groups(n, words, min_count=2, max_words=None, seed=3, max_occurrences=20)
    assert max(m for m, _, _ in g.mev.blocks) == 20 and len(g.mev.rows) == 2 * sum(map(len, capped))
    w_perm = np.random.default_rng(3).permutation(np.unique(words, return_inverse=True)[1])
    for centred in (False, True):
        got, got_shuffled = mev_pair(torch.from_numpy(X[g.mev.rows]), g.mev, centred=centred)
        T = torch.from_numpy(X)
        assert got == pytest.approx(mev(T, words, 2, None, 3, centred=centred, max_occurrences=20), rel=1e-12)
        assert got_shuffled == pytest.approx(mev(T, w_perm, 2, None, 3, centred=centred, max_occurrences=20),
                                             rel=1e-12)
    assert counts.max() > 20
    with pytest.raises(ValueError, match="at least 2"):
        mev_groups(words, 2, None, 3, max_occurrences=1)


def test_mev_known_answers_and_bad_input():
    from geometry._mev import mev_layout, mev_pair

    codes = np.repeat(np.arange(4), [3, 3, 5, 1])  # type 3 has too few occurrences
    lay = mev_layout(codes, codes.copy(), min_count=2, max_words=None, seed=0)
    assert lay.n_groups == 3 and [(m, i.tolist()) for m, i, _ in lay.blocks] == [(3, [0, 1]), (5, [2])]
    v = np.ones((12, 4))
    rank_one = np.array([1.0, 2.0, 3.0, 0.5, 1.5, 2.5, 4.0, 1.0, 2.0, 3.0, 4.0, 5.0])[:, None] * v
    assert lay.rows.tolist() == [*range(0, 6), *range(0, 6), *range(6, 11), *range(6, 11)]
    Y = torch.from_numpy(rank_one[lay.rows])  # every group is rank one: MEV 1
    assert mev_pair(Y, lay) == pytest.approx((1.0, 1.0), abs=1e-6)  # the size-5 groups: float32 σ₁² (5 > d)
    with pytest.raises(ValueError, match="the layout's 22 rows"):
        mev_pair(Y[:5], lay)
    with pytest.raises(ValueError, match="permutation of codes"):
        mev_layout(codes, np.zeros_like(codes), min_count=2, max_words=None, seed=0)
    assert mev_layout(np.arange(5), np.arange(5), min_count=2, max_words=None, seed=0) is None


def test_labels_prepared_once_equal_per_layer_runs():
    """layers_anisotropy prepares the labels once for all layers; each layer equals its own
    layer_anisotropy call, and a raw-only run (no metrics pass) equals the raw part of a full one."""
    from geometry.moments import layer_anisotropy, layers_anisotropy

    X, words, sentences = structured(n=500, d=20)
    layers = [X, X * 0.3 + np.random.default_rng(7).normal(size=X.shape)]
    pps = ("raw", "whiten", "clip")
    kw = dict(words=words, sentences=sentences, min_count=3, max_words=30, seed=2)
    together = list(layers_anisotropy(layers, pps, **kw))
    for L, res in zip(layers, together):
        alone = layer_anisotropy(L, pps, **kw)
        raw_only = layer_anisotropy(L, ("raw",), **kw)["raw"]
        # the same float64 sums of the same rows, but BLAS may block a batched product and a single one
        # differently (seen: 1 ulp of top_pc_share on an AMD EPYC): equal to float64 reordering, a few
        # hundred ulps at most for sums over 500 rows, far below any difference a wrong label would make
        for pp in pps:
            for k, v in res[pp].items():
                np.testing.assert_allclose(v, alone[pp][k], rtol=1e-12, atol=1e-14, err_msg=f"{pp} {k}")
        for k, v in raw_only.items():
            np.testing.assert_allclose(v, res["raw"][k], rtol=1e-12, atol=1e-14, err_msg=k)
    with pytest.raises(ValueError, match=r"one label per token, shape \(499,\)"):
        list(layers_anisotropy([X, X[:499]], pps, **kw))


def test_whitened_top_share_from_its_spectrum_equals_eigvalsh():
    from geometry._transforms import top_share

    v = torch.tensor([0.9, -1e-9, 0.2, 0.999, 0.5], dtype=torch.float64)
    ev = torch.linalg.eigvalsh(torch.diag(v)).clamp(min=0)
    assert top_share(spectrum=v) == float(ev[-1] / ev.sum())
    assert top_share(torch.diag(v)) == top_share(spectrum=v)
    assert top_share(spectrum=v) == pytest.approx(0.999 / (0.9 + 0.2 + 0.999 + 0.5), rel=1e-15)


def test_word_groups_renumbered_to_the_kept_types():
    from geometry._groups import Groups

    g = Groups(7, np.array(["b", "b", "c", "z", "z", "z", "a"]), np.array([3, 3, 3, 8, 8, 8, 8]), min_count=2)
    on = g.on(torch.device("cpu"))
    # kept word types in code order ("b" -> 0, "z" -> 1); "a" and "c" share the unread group 2
    assert on["L"]["w"].tolist() == [0, 0, 2, 1, 1, 1, 2] and on["G"]["w"] == 3
    assert on["keep"]["w"].tolist() == [True, True, False] and on["m"]["w"].tolist() == [2.0, 3.0, 2.0]
    assert on["L"]["s"].tolist() == [0, 0, 0, 1, 1, 1, 1] and on["keep"]["s"].tolist() == [True, True]
    assert g.on(torch.device("cpu")) is on  # made once per device


def test_row_steps_do_not_change_the_measures(monkeypatch):
    """The unit-row sums run a few hundred rows at a time inside each chunk; other step sizes give
    the same measures to float64 rounding."""
    import geometry.moments as gm

    X, words, sentences = structured(n=700, d=16)
    kw = dict(words=words, sentences=sentences, min_count=3, max_words=20)
    want = gm.layer_anisotropy(X, geometry.POSTPROCESSING, **kw)
    monkeypatch.setattr(gm, "_SUB", 37)
    got = gm.layer_anisotropy(X, geometry.POSTPROCESSING, **kw)
    for pp in geometry.POSTPROCESSING:
        for k, v in want[pp].items():
            np.testing.assert_allclose(got[pp][k], v, rtol=1e-12, atol=1e-15, err_msg=f"{pp} {k}")


def test_affine_context_sums_from_the_raw_ones():
    """Transforms.sums: the post-processed rows' group sums from the raw rows' group sums equal
    summing the post-processed rows themselves (exactly in float64 arithmetic; to float32 rounding
    of the rows that fns returns); clipping has none."""
    from geometry._transforms import Transforms
    from geometry.moments import _Moments

    X, _, sentences = structured(n=600, d=12)
    T = torch.tensor(X, dtype=torch.float32)
    mom = _Moments(T)
    tf = Transforms(T, mom, geometry.POSTPROCESSING, 3)
    assert set(tf.sums) == {"raw", "standardize", "whiten", "remove_top"}
    g = torch.as_tensor(np.unique(sentences, return_inverse=True)[1])
    m = torch.bincount(g).double()
    group = lambda Y: torch.zeros((len(m), Y.shape[1]), dtype=torch.float64).index_add_(0, g, Y)  # noqa: E731
    S = group(T.double())
    for pp, f in tf.sums.items():
        np.testing.assert_allclose(f(S, m), group(tf.fns[pp](T).double()), rtol=1e-5, atol=1e-4, err_msg=pp)
    # the fitted float32 parameters applied in float64: the same sums to float64 rounding
    mu, sd = mom.mean.float().double(), mom.cov.diagonal().sqrt().float().double()
    np.testing.assert_allclose(tf.sums["standardize"](S, m), group((T.double() - mu) / sd), rtol=1e-11, atol=1e-10)
    keep = torch.ones(12, dtype=torch.bool)
    keep[torch.as_tensor(np.argsort(-mom.cc.numpy(), kind="stable")[:3])] = False
    assert torch.equal(tf.sums["remove_top"](S, m), group(T.double()[:, keep]))


def test_centred_mev_known_answers():
    """Centred MEV (the paper's code: a PCA of each type's occurrences) against the uncentred definition:
    occurrences that share a large common vector and differ along one direction have an uncentred MEV near
    1 (the common vector dominates) and a centred MEV of exactly 1 (one direction of variation); isotropic
    noise around a common vector: uncentred still near 1, centred near 1/min(occurrences-1, d)."""
    from geometry._mev import mev_layout, mev_pair

    rng = np.random.default_rng(0)
    d, k = 16, 6
    common = 10 * rng.standard_normal(d)
    line = common + np.outer(rng.standard_normal(k), rng.standard_normal(d))  # rank-1 variation
    codes = np.zeros(k, dtype=np.int64)
    assert mev(line, codes, centred=True) == pytest.approx(1.0, abs=1e-9)
    noise = common + 1e-3 * rng.standard_normal((400, d))
    codes = np.zeros(400, dtype=np.int64)
    assert mev(noise, codes) > 0.999
    assert mev(noise, codes, centred=True) == pytest.approx(1 / d, rel=0.5)
    lay = mev_layout(codes, codes.copy(), min_count=2, max_words=None, seed=0)  # 400 > d: the float32 path
    got = mev_pair(torch.from_numpy(noise[lay.rows]), lay, centred=True)[0]
    assert got == pytest.approx(mev(noise, codes, centred=True), rel=1e-4)
