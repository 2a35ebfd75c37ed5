"""Logit lens: the last layer's lens is the model's own output (untied RMSNorm Llama, LayerNorm GPT-2,
tied SmolLM2), the metrics are right on a hand-made decoder, chunking changes nothing, and encoders are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lens
from lens.readout.logit_lens import Readout, last_layer_logit_diff, lens_metrics, logit_lens


def _store(model, n=200, sites=("resid_post",)):
    return lens.capture(model, corpus="lee", sites=list(sites), max_tokens=n, seq_len=64, progress=False)


def _hf_logits_and_last_state(model, ids):
    """The model's logits and its last block's output from one forward (hook-free: output_hidden_states
    gives the final-normed state at the end for some models, so read the block output directly)."""
    got = {}
    h = model.layers[-1].register_forward_hook(lambda m, a, o: got.__setitem__("x", o[0] if isinstance(o, (tuple, list)) else o))
    try:
        with torch.inference_mode():
            logits = model.hf_model(input_ids=ids, use_cache=False).logits
    finally:
        h.remove()
    return logits, got["x"]


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gpt2"])
def test_last_layer_lens_equals_model_logits(name, request):
    model = request.getfixturevalue(name)
    assert model.n_layers == 4 and model.d_model == 64
    ids = torch.as_tensor(model.tokenizer("The logit lens decodes the last layer exactly.")["input_ids"])[None]
    logits, last = _hf_logits_and_last_state(model, ids)
    with torch.inference_mode():
        lens_logits = model.decode(last)
    torch.testing.assert_close(lens_logits, logits, atol=1e-5, rtol=0)
    # and through the store + the study's check
    store = _store(model, 150)
    L = model.n_layers
    diff = last_layer_logit_diff(model, store.get(layer=L - 1), store.tokens["token_id"], store.tokens["window"])
    assert diff < 1e-4


def test_a_post_norm_decoder_lens_is_the_unembedding_alone():
    """GPT-1 (openai-gpt) ends every block in its own LayerNorm and has no final norm: its lens is the
    unembedding alone, and the last layer's lens is its logits (it was refused as 'no final norm')."""
    model = lens.load_model("tiny:openai-gpt")
    head = model.site_map.head
    assert head.norm is None and head.usable and model.final_norm is None
    ids = torch.randint(0, 200, (1, 12), generator=torch.Generator().manual_seed(0))
    logits, last = _hf_logits_and_last_state(model, ids)
    with torch.inference_mode():
        lens_logits = model.decode(last)
    assert float((lens_logits - logits).abs().max()) <= 1e-4
    L = model.n_layers
    states = {layer: torch.randn(12, model.d_model, generator=torch.Generator().manual_seed(layer))
              for layer in range(L - 1)}
    states[L - 1] = last[0]
    res = logit_lens(model, states, last[0], ids[0].roll(-1))
    assert res.kl_to_final[-1] == pytest.approx(0.0, abs=1e-5) and np.all(np.isfinite(res.ce))


def test_gpt2_is_layernorm_and_tied_llama_untied(tiny_llama, tiny_gpt2):
    assert isinstance(tiny_gpt2.final_norm, torch.nn.LayerNorm)
    assert tiny_gpt2.unembed_module.weight.data_ptr() == tiny_gpt2.hf_model.get_input_embeddings().weight.data_ptr()
    assert "RMSNorm" in type(tiny_llama.final_norm).__name__
    assert tiny_llama.unembed_module.weight.data_ptr() != tiny_llama.hf_model.get_input_embeddings().weight.data_ptr()


def test_metrics_last_layer_and_shapes(tiny_llama):
    model = tiny_llama
    store = _store(model, 200, sites=("resid_post", "resid_mid"))
    L = model.n_layers
    states = {l: store.get(layer=l).numpy() for l in range(L)}  # numpy input works too
    rows = np.arange(7)
    r = logit_lens(model, states, store.get(layer=L - 1), store.tokens["next_token_id"], topk_rows=rows, top_k=5,
                   chunk_size=64)
    assert r.layers.tolist() == list(range(L))
    assert r.kl_to_final[-1] == pytest.approx(0, abs=1e-5) and r.top1_agreement[-1] == 1
    assert np.all(r.kl_to_final >= -1e-5) and np.all(r.entropy > 0)
    assert r.topk_ids.shape == (L, 7, 5) and np.all(np.diff(r.topk_probs, axis=-1) <= 1e-7)
    nt = store.tokens["next_token_id"]
    assert np.all(np.isnan(r.token_ce[:, nt < 0])) and np.all(r.token_rank[:, nt < 0] == -1)
    # the top-1 slot is the lens' argmax, with the true token's rank 0 exactly where it is the argmax
    assert np.array_equal(r.topk_ids[:, :, 0], r.token_top1[:, rows])
    ok = nt >= 0
    assert np.array_equal(r.token_rank[:, ok] == 0, r.token_top1[:, ok] == nt[ok])
    # chunking does not change the answer
    r2 = logit_lens(model, states, store.get(layer=L - 1), nt, chunk_size=1000)
    np.testing.assert_allclose(r2.ce, r.ce, rtol=1e-5)
    np.testing.assert_array_equal(r2.token_rank, r.token_rank)
    # resid_mid decodes too
    mid = logit_lens(model, {l: store.get("resid_mid", l) for l in range(L)}, store.get(layer=L - 1), nt)
    assert np.all(np.isfinite(mid.ce))


def test_metrics_known_answer_on_identity_decoder():
    """Decoder = identity on 3-token 'vocab' logits: CE, KL, entropy and rank by hand."""
    final = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    layer = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    targets = np.array([0, -1])
    r = lens_metrics({0: layer, 1: final}, final, targets, Readout(pre=lambda l, h: h, weight=torch.eye(3)))
    lp = torch.log_softmax(layer, -1)
    pf = torch.softmax(final, -1)
    assert r.ce[0] == pytest.approx(float(-lp[0, 0]), rel=1e-6)
    kl = (pf * (pf.log() - lp)).sum(-1).mean()
    assert r.kl_to_final[0] == pytest.approx(float(kl), rel=1e-5)
    assert r.token_rank[0, 0] == 1 and r.token_rank[1, 0] == 0 and r.median_rank.tolist() == [1, 0]
    assert r.top1_agreement.tolist() == [0.5, 1.0] and r.n_scored == 1
    ent = -(lp.exp() * lp).sum(-1).mean()
    assert r.entropy[0] == pytest.approx(float(ent), rel=1e-5)


def test_bad_input(tiny_llama, tiny_bert):
    with pytest.raises(lens.LensInputError, match="language-model head"):
        logit_lens(tiny_bert, {0: torch.zeros(3, 64)}, torch.zeros(3, 64), np.zeros(3, int))
    with pytest.raises(lens.LensInputError, match="expected 3"):
        logit_lens(tiny_llama, {0: torch.zeros(2, 64)}, torch.zeros(3, 64), np.zeros(3, int))
    with pytest.raises(lens.LensInputError, match="scored"):
        logit_lens(tiny_llama, {0: torch.zeros(3, 64)}, torch.zeros(3, 64), -np.ones(3, int))


@pytest.mark.slow
def test_smollm2_tied_last_layer_equals_logits(smollm2):
    assert smollm2.n_layers == 30 and smollm2.d_model == 576 and smollm2.d_vocab == 49152
    assert smollm2.unembed_module.weight.data_ptr() == smollm2.hf_model.get_input_embeddings().weight.data_ptr()
    ids = torch.as_tensor(smollm2.tokenizer("The capital of France is Paris, and the capital of")["input_ids"])[None]
    logits, last = _hf_logits_and_last_state(smollm2, ids)
    with torch.inference_mode():
        diff = (smollm2.decode(last) - logits).abs().max()
    assert float(diff) < 1e-4


def test_bias_enters_every_metric():
    """A readout with an unembedding bias: CE, KL and entropy equal the hand-computed softmax ones."""
    g = torch.Generator().manual_seed(0)
    W, b = torch.randn(7, 4, generator=g), torch.randn(7, generator=g)
    final, layer = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    targets = np.array([0, 3, 6, 2, 1])
    r = lens_metrics({0: layer, 1: final}, final, targets, Readout(pre=lambda l, h: h, weight=W, bias=b), fused=False)
    lp, pf = torch.log_softmax(layer @ W.T + b, -1), torch.softmax(final @ W.T + b, -1)
    assert r.ce[0] == pytest.approx(float(-lp[torch.arange(5), torch.as_tensor(targets)].mean()), rel=1e-5)
    assert r.kl_to_final[0] == pytest.approx(float((pf * (pf.log() - lp)).sum(-1).mean()), rel=1e-5)
    assert r.entropy[0] == pytest.approx(float(-(lp.exp() * lp).sum(-1).mean()), rel=1e-5)
    assert r.kl_to_final[1] == pytest.approx(0, abs=1e-5)


def test_fused_kernel_gives_the_eager_numbers(tiny_llama):
    """The compiled per-row statistics (the CPU default for large jobs) equal the eager ops."""
    model = tiny_llama
    store = _store(model, 300)
    L = model.n_layers
    states = {l: store.get(layer=l) for l in range(L)}
    nt = store.tokens["next_token_id"]
    kw = dict(chunk_size=128, topk_rows=np.arange(5), top_k=3)
    eager = logit_lens(model, states, states[L - 1], nt, fused=False, **kw)
    fused = logit_lens(model, states, states[L - 1], nt, fused=True, **kw)
    for key in ("token_ce", "token_kl", "token_entropy", "topk_probs"):
        np.testing.assert_allclose(getattr(fused, key), getattr(eager, key), rtol=1e-4, atol=1e-5, err_msg=key)
    for key in ("token_rank", "token_top1", "topk_ids"):
        np.testing.assert_array_equal(getattr(fused, key), getattr(eager, key), err_msg=key)


def test_store_lens_decodes_each_row_once_and_equals_the_lens(tiny_llama, monkeypatch):
    """Rows decoded by one request are not decoded again by the next on the same store and site, and
    every request's result equals the plain lens of its own rows."""
    import lens.readout.logit_lens as ll
    import lens.readout.store_lens as sl

    model = tiny_llama
    store = _store(model, 200, sites=("resid_post", "resid_mid"))
    L = model.n_layers
    nt = np.asarray(store.tokens["next_token_id"])
    mask = store.mask()
    decoded = []
    real = ll.token_metrics
    monkeypatch.setattr(sl, "token_metrics", lambda states, *a, **k: decoded.append(len(next(iter(states.values()))))
                        or real(states, *a, **k))
    sl.clear()

    def plain(rows, site="resid_post", **kw):
        states = {l: store.get(layer=l, site=site, dtype=torch.float32)[rows] for l in store.layers(site)}
        final = store.get(layer=L - 1, dtype=torch.float32)[rows]
        return logit_lens(model, states, final, nt[rows], mask=mask[rows], **kw)

    a_rows, b_rows = np.arange(20, 120), np.arange(60, 180)
    a = sl.store_logit_lens(model, store, a_rows, mask=mask[a_rows])
    b = sl.store_logit_lens(model, store, b_rows, mask=mask[b_rows], topk_rows=np.arange(5), top_k=3)
    assert decoded == [100, 60]  # b: only the 60 rows a did not decode (a kept every row's top-k too)
    ref_b = plain(b_rows, topk_rows=np.arange(5), top_k=3)
    for got, ref in ((a, plain(a_rows)), (b, ref_b)):
        for f in ("ce", "kl_to_final", "top1_agreement", "entropy", "median_rank", "token_ce", "token_kl",
                  "token_rank", "token_top1"):
            np.testing.assert_allclose(np.asarray(getattr(got, f), float), np.asarray(getattr(ref, f), float),
                                       atol=1e-5, rtol=0, err_msg=f)
    np.testing.assert_array_equal(b.topk_ids, ref_b.topk_ids)
    np.testing.assert_allclose(b.topk_probs, ref_b.topk_probs, atol=1e-6)
    # another site is kept apart, against the same reference (the last resid_post)
    mid = sl.store_logit_lens(model, store, a_rows, site="resid_mid", mask=mask[a_rows])
    np.testing.assert_allclose(mid.kl_to_final, plain(a_rows, site="resid_mid").kl_to_final, atol=1e-5)
    assert decoded[-1] == 100
    # a deeper top-k than the memo keeps decodes the rows asked for again, and equals the lens
    deep = sl.store_logit_lens(model, store, a_rows, mask=mask[a_rows], topk_rows=np.arange(3), top_k=sl.MEMO_TOP_K + 2)
    assert decoded[-1] == 3
    np.testing.assert_array_equal(deep.topk_ids, plain(a_rows, topk_rows=np.arange(3), top_k=sl.MEMO_TOP_K + 2).topk_ids)
    sl.clear()
