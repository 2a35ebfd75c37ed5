"""Our captured states equal Hugging Face output_hidden_states and each other across backends."""

import pytest
import torch

import lens
from lens.capturing.backends import make_backend
from lens.sites import HookSite, Site

ALL_SITES = ["embed", "resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "final_norm"]


def _hf_hidden(model, ids):
    out = model.hf_model(input_ids=ids, output_hidden_states=True)
    return out.hidden_states


def _check_against_hf(model, store, win_ids, offsets, batch_size, atol=1e-5, rtol=0.0):
    """HF's hidden states on the same padded batches equal the store's rows (fp32, atol 1e-5)."""
    L = model.n_layers
    for lo in range(0, min(len(win_ids), 2 * batch_size), batch_size):
        chunk = win_ids[lo:lo + batch_size]
        width = max(len(c) for c in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, c in enumerate(chunk):
            ids[i, :len(c)] = torch.as_tensor(c)
            mask[i, :len(c)] = 1
        hs = model.hf_model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        for i, c in enumerate(chunk):
            rows = slice(int(offsets[lo + i]), int(offsets[lo + i + 1]))
            n = len(c)
            torch.testing.assert_close(store.get(site="embed")[rows], hs[0][i, :n], atol=atol, rtol=rtol)
            for l in range(L):
                got = store.get("resid_post", l)[rows]
                if l < L - 1 or not model.has_lm_head:
                    want = hs[l + 1][i, :n]
                else:  # HF's last hidden state is after the final norm
                    want = hs[L][i, :n]
                    got = store.get(site="final_norm")[rows]
                torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
                if l > 0:
                    torch.testing.assert_close(store.get("resid_pre", l)[rows], hs[l][i, :n], atol=atol, rtol=rtol)


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gpt2", "tiny_bert"])
def test_native_capture_equals_hf_hidden_states(name, request):
    from lens.text.corpora import load_corpus, make_windows

    model = request.getfixturevalue(name)
    sites = [s for s in ALL_SITES if s in {x.value for x in model.site_map.taps}]
    store = lens.capture(model, corpus="lee", sites=sites, max_tokens=400, seq_len=64, batch_size=4,
                         progress=False)
    win = make_windows(load_corpus("lee"), model.tokenizer, seq_len=64, max_tokens=400, is_causal=model.is_causal)
    assert store.n_tokens == win.n_tokens == 400
    _check_against_hf(model, store, win.input_ids, win.window_offsets(), 4)
    # sub-block outputs add up to the residual update
    for l in range(model.n_layers):
        if model.family != "bert":
            torch.testing.assert_close(store.get("resid_pre", l) + store.get("attn_out", l),
                                       store.get("resid_mid", l), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(store.get("resid_mid", l) + store.get("mlp_out", l),
                                       store.get("resid_post", l), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gpt2"])
@pytest.mark.parametrize("backend", ["transformer-lens", "nnsight"])
def test_backends_agree(name, backend, request):
    model = request.getfixturevalue(name)
    sites = ["embed", "resid_mid", "resid_post", "attn_out", "mlp_out", "final_norm"]
    ref = lens.capture(model, corpus="lee", sites=sites, max_tokens=300, seq_len=64, batch_size=4, progress=False)
    got = lens.capture(model, corpus="lee", sites=sites, max_tokens=300, seq_len=64, batch_size=4,
                       progress=False, backend=backend)
    for site in sites:
        for layer in ref.layers(site) if Site(site).per_layer else [None]:
            torch.testing.assert_close(got.get(site, layer), ref.get(site, layer), atol=1e-5, rtol=1e-5)


def test_nnsight_backend_on_an_encoder(tiny_bert):
    ref = lens.capture(tiny_bert, corpus="lee", sites=["resid_post"], max_tokens=200, seq_len=32, progress=False)
    got = lens.capture(tiny_bert, corpus="lee", sites=["resid_post"], max_tokens=200, seq_len=32, progress=False,
                       backend="nnsight")
    for l in ref.layers():
        torch.testing.assert_close(got.get(layer=l), ref.get(layer=l), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["native", "transformer-lens", "nnsight"])
def test_capture_leaves_logits_unchanged(tiny_llama, backend):
    ids = torch.tensor([[11, 12, 13, 14, 15, 16], [21, 22, 23, 24, 0, 0]])
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    plain = tiny_llama.hf_model(input_ids=ids, attention_mask=mask).logits
    before = _hook_ids(tiny_llama.hf_model)
    hooks = [HookSite(Site.RESID_POST, l) for l in range(4)] + [HookSite(Site.ATTN_OUT, 1)]
    engine = make_backend(backend, tiny_llama, hooks)
    states, logits = engine.run(ids, mask, return_logits=True)
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=1e-5)
    assert set(states) == {h.key for h in hooks}
    # and after capture the model is as it was: no hooks left behind
    torch.testing.assert_close(tiny_llama.hf_model(input_ids=ids, attention_mask=mask).logits, plain)
    assert _hook_ids(tiny_llama.hf_model) == before


def _hook_ids(module):
    return {(n, k) for n, m in module.named_modules() for k in [*m._forward_hooks, *m._forward_pre_hooks]}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["native", "transformer-lens", "nnsight"])
def test_smollm2_backends_equal_hf(smollm2, backend):
    from lens.text.corpora import load_corpus, make_windows

    store = lens.capture(smollm2, corpus="wiki-sample", sites=["embed", "resid_pre", "resid_post", "final_norm"],
                         max_tokens=256, seq_len=64, batch_size=4, progress=False, backend=backend)
    win = make_windows(load_corpus("wiki-sample"), smollm2.tokenizer, seq_len=64, max_tokens=256)
    _check_against_hf(smollm2, store, win.input_ids, win.window_offsets(), 4)
