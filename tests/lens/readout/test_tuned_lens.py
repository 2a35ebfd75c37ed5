"""Tuned lens: identity at initialisation, training lowers the KL to the final layer on a tiny model
(never worse than the logit lens on its training data), save/load round trip without pickle."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import lens
from lens.readout.logit_lens import logit_lens
from lens.readout.tuned_lens import TunedLens, fit_tuned_lens, tuned_lens_metrics


@pytest.fixture(scope="module")
def store(tiny_llama):
    return lens.capture(tiny_llama, corpus="lee", sites=["resid_post"], max_tokens=256, seq_len=64, progress=False)


def test_identity_at_init_equals_logit_lens(tiny_llama, store):
    L = tiny_llama.n_layers
    states = {l: store.get(layer=l) for l in range(L)}
    nt = store.tokens["next_token_id"]
    tl = TunedLens(tiny_llama.d_model, range(L - 1))
    a = tuned_lens_metrics(tiny_llama, tl, states, store.get(layer=L - 1), nt)
    b = logit_lens(tiny_llama, states, store.get(layer=L - 1), nt)
    np.testing.assert_allclose(a.ce, b.ce, rtol=1e-6)
    np.testing.assert_allclose(a.kl_to_final, b.kl_to_final, rtol=1e-5, atol=1e-7)


def test_training_beats_logit_lens_and_round_trips(tiny_llama, store, tmp_path):
    L = tiny_llama.n_layers
    states = {l: store.get(layer=l) for l in range(L)}
    final = store.get(layer=L - 1)
    nt = store.tokens["next_token_id"]
    params_before = [(p.detach().clone(), p.requires_grad) for p in tiny_llama.hf_model.parameters()]
    tl = fit_tuned_lens(tiny_llama, states, final, steps=12, batch_tokens=64, lr=1e-2, seed=0)
    assert tl.layer_ids == [0, 1, 2]  # the last layer keeps the identity
    assert tl.loss_history_.shape == (12, 3)
    # the frozen model is untouched and got no gradients
    for p, (q, flag) in zip(tiny_llama.hf_model.parameters(), params_before):
        assert torch.equal(p, q) and p.grad is None and p.requires_grad == flag
    tuned = tuned_lens_metrics(tiny_llama, tl, states, final, nt)
    logit = logit_lens(tiny_llama, states, final, nt)
    assert np.all(tuned.kl_to_final[:-1] < logit.kl_to_final[:-1])
    assert tuned.kl_to_final[-1] == pytest.approx(0, abs=1e-5)

    tl.save(tmp_path / "tl")
    meta = json.loads((tmp_path / "tl" / "tuned_lens.json").read_text())
    assert meta["layers"] == [0, 1, 2] and meta["training"]["steps"] == 12
    back = TunedLens.load(tmp_path / "tl")
    h = torch.randn(5, tiny_llama.d_model)
    for l in range(L):
        torch.testing.assert_close(back.translate(l, h), tl.translate(l, h), atol=0, rtol=0)


def test_mixed_precision_training_trains_a_float32_lens_as_well(tiny_llama, store):
    """bfloat16 training steps (autocast) leave float32 weights that beat the logit lens like float32
    training does, close to the float32-trained lens; the record says which precision ran."""
    from lens.runtime.precision import native_bfloat16

    L = tiny_llama.n_layers
    states = {l: store.get(layer=l) for l in range(L)}
    final = store.get(layer=L - 1)
    nt = store.tokens["next_token_id"]
    kw = dict(steps=12, batch_tokens=64, lr=1e-2, seed=0)
    full = fit_tuned_lens(tiny_llama, states, final, precision="float32", **kw)
    mixed = fit_tuned_lens(tiny_llama, states, final, precision="bfloat16", **kw)
    auto = fit_tuned_lens(tiny_llama, states, final, precision="auto", steps=1, batch_tokens=8)
    assert full.training_record["precision"] == "float32"
    assert mixed.training_record["precision"] == "bfloat16 (mixed)"
    assert auto.training_record["precision"] == ("bfloat16 (mixed)" if native_bfloat16("cpu") else "float32")
    assert all(p.dtype == torch.float32 for p in mixed.parameters())
    a = tuned_lens_metrics(tiny_llama, full, states, final, nt)
    b = tuned_lens_metrics(tiny_llama, mixed, states, final, nt)
    logit = logit_lens(tiny_llama, states, final, nt)
    assert np.all(b.kl_to_final[:-1] < logit.kl_to_final[:-1])
    np.testing.assert_allclose(b.ce, a.ce, rtol=0.02)
    with pytest.raises(lens.LensInputError, match="precision"):
        fit_tuned_lens(tiny_llama, states, final, steps=1, precision="float16")


def test_bad_input(tiny_llama, tiny_bert, tmp_path):
    with pytest.raises(lens.LensInputError, match="not a saved tuned lens"):
        TunedLens.load(tmp_path)
    with pytest.raises(lens.LensInputError, match="language-model head"):
        fit_tuned_lens(tiny_bert, {0: torch.zeros(4, 64)}, torch.zeros(4, 64), steps=1)
    with pytest.raises(lens.LensInputError, match="training tokens"):
        fit_tuned_lens(tiny_llama, {0: torch.zeros(4, 64)}, torch.zeros(4, 64), train_rows=[1])
    with pytest.raises(lens.LensInputError, match="no translator"):
        TunedLens(64, [0, 1])._index(5)


def test_least_squares_init_recovers_a_planted_affine_map():
    """Known answer: when the last layer is an exact affine function of layer 0, the least-squares
    start (Din et al. 2023) maps layer 0 onto it."""
    from lens.readout.tuned_lens import least_squares_init

    g = torch.Generator().manual_seed(0)
    X = torch.randn(400, 16, generator=g)
    M, c = torch.randn(16, 16, generator=g), torch.randn(16, generator=g)
    final = X @ M + c
    tl = TunedLens(16, [0])
    least_squares_init(tl, {0: X}, final, np.arange(400), ridge=1e-9)
    with torch.no_grad():
        torch.testing.assert_close(tl.translate(0, X), final, atol=1e-3, rtol=1e-4)


def test_nested_fits_share_one_least_squares_pass_and_equal_the_fits_apart(tiny_llama, store):
    """fit_tuned_lenses (the study's nested refits): each lens is the one fit_tuned_lens gives on its rows alone —
    the least-squares starts summed by groups of rows in one pass, the KL steps each its own — and a planted affine
    map far from the origin (means 1e3 × the spread) is recovered from the shifted moments."""
    from lens.readout.tuned_lens import fit_tuned_lenses, least_squares_inits

    L = tiny_llama.n_layers
    states = {l: store.get(layer=l) for l in range(L)}
    final = store.get(layer=L - 1)
    n = len(final)
    quarter = np.arange(0, n, 4)
    half = np.union1d(quarter, np.arange(1, n, 4))
    rows = [quarter, half, None]
    together = fit_tuned_lenses(tiny_llama, states, final, rows, steps=[1, 2, 3], batch_tokens=16, init="lstsq",
                                precision="float32")
    for r, k, got in zip(rows, [1, 2, 3], together):
        apart = fit_tuned_lens(tiny_llama, states, final, train_rows=r, steps=k, batch_tokens=16, init="lstsq",
                               precision="float32")
        assert got.training_record["steps"] == k
        for a, b in zip(got.parameters(), apart.parameters()):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)

    g = torch.Generator().manual_seed(1)
    X = torch.randn(300, 8, generator=g, dtype=torch.float64) + 1e3
    M, c = torch.randn(8, 8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    lenses = [TunedLens(8, [0]) for _ in range(2)]
    least_squares_inits(lenses, {0: X}, X @ M + c, [np.arange(150), np.arange(300)], ridge=1e-12, chunk_rows=64)
    for t in lenses:
        torch.testing.assert_close((t.translators[0].weight.double() + torch.eye(8)).T, M, atol=1e-3, rtol=1e-4)


def test_least_squares_start_beats_the_logit_lens_before_any_step(tiny_llama, store):
    L = tiny_llama.n_layers
    states = {l: store.get(layer=l) for l in range(L)}
    final, nt = store.get(layer=L - 1), store.tokens["next_token_id"]
    tl = fit_tuned_lens(tiny_llama, states, final, steps=0, init="lstsq")
    assert tl.training_record["init"] == "lstsq"
    tuned = tuned_lens_metrics(tiny_llama, tl, states, final, nt)
    logit = logit_lens(tiny_llama, states, final, nt)
    assert np.all(tuned.kl_to_final[:-1] < logit.kl_to_final[:-1])
    with pytest.raises(lens.LensInputError, match="init must be"):
        fit_tuned_lens(tiny_llama, states, final, steps=0, init="zeros")


def test_fused_kl_equals_autograd_through_log_softmax():
    from lens.readout.row_stats import kl_to_reference, log_softmax

    g = torch.Generator().manual_seed(0)
    ref_lp = torch.log_softmax(3 * torch.randn(7, 301, generator=g, dtype=torch.float64), -1).float()
    p_ref = ref_lp.exp()
    negent = (p_ref * ref_lp).sum(-1)
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        z = (4 * torch.randn(7, 301, generator=g)).to(dtype)
        a = z.clone().requires_grad_(True)
        b = z.clone().requires_grad_(True)
        loss_a = (negent - (p_ref * log_softmax(a.float())).sum(-1)).mean()
        loss_a.backward()
        loss_b = kl_to_reference(b, p_ref, negent)
        loss_b.backward()
        assert b.grad.dtype == dtype
        assert float(loss_b) == pytest.approx(float(loss_a), rel=1e-6)
        assert torch.allclose(b.grad.float(), a.grad.float(), atol=tol * float(a.grad.abs().max()))
    # a known answer: KL of a distribution to itself is 0, its gradient 0
    z = ref_lp.clone().requires_grad_(True)
    kl = kl_to_reference(z, p_ref, negent)
    kl.backward()
    assert abs(float(kl)) < 1e-6 and float(z.grad.abs().max()) < 1e-7


def test_fused_kl_does_not_assume_the_reference_sums_to_one():
    """Float32 probabilities over a real vocabulary sum to 1 only up to rounding (~1e-4 at 49k); the KL's
    logsumexp term is weighted by their sum, as Σ p (log p − log q) is. Known answer in float64."""
    from lens.readout.row_stats import kl_to_reference

    g = torch.Generator().manual_seed(1)
    vocab = 49_152
    p64 = torch.softmax(2 * torch.randn(4, vocab, generator=g, dtype=torch.float64), -1) * (1 + 3e-4)
    z64 = 5 + 3 * torch.randn(4, vocab, generator=g, dtype=torch.float64)  # logsumexp ≈ 20: a sum error shows
    negent = (p64 * p64.log()).sum(-1)
    expected = float((negent - (p64 * torch.log_softmax(z64, -1)).sum(-1)).mean())
    got = float(kl_to_reference(z64.float(), p64.float(), negent.float()))
    assert got == pytest.approx(expected, abs=2e-5)  # the float32 sums; assuming Σp = 1 is off by ~6e-3 here
