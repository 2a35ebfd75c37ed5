"""Rescaled residual streams: RWKV with ``rescale_every`` halves its stream every k blocks (every real
RWKV-4 checkpoint does), MiniCPM adds its sub-blocks times ``scale_depth / sqrt(n_layers)``. The probe finds
the factors, the card records them per layer, and the captured sites are the states as the stream carries
them: equal to Hugging Face's hidden states, with the block identities holding."""

from __future__ import annotations

import math

import torch

import lens
from lens.model.tiny import build_tiny
from lens.text.corpora import load_corpus, make_windows

ATOL = 1e-5


def _windows(model):
    return make_windows(load_corpus("lee"), model.tokenizer, seq_len=16, max_tokens=64, is_causal=True)


def _hf(model, win):
    """Hidden states and logits of Hugging Face's own forward, window by window, (entries, tokens, d)."""
    hs, logits = [], []
    with torch.inference_mode():
        for w in win.input_ids:
            ids = torch.as_tensor(list(w))[None]
            out = model.hf_model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True,
                                 use_cache=False)
            hs.append(torch.stack(out.hidden_states)[:, 0])
            logits.append(out.logits[0])
    return torch.cat(hs, dim=1), torch.cat(logits)


def _capture(model, sites):
    return lens.capture(model, corpus="lee", sites=sites, seq_len=16, max_tokens=64, batch_size=2, progress=False)


def _diff(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


def test_rwkv_with_rescale_every_is_captured_equal_to_hugging_face():
    model = lens.load_model(build_tiny("rwkv", rescale_every=2))
    card = model.card()
    assert card.site_scales == {"resid_post": [1.0, 0.5, 1.0]}  # the stream halves after block 1
    store = _capture(model, list(card.sites))
    hs, logits = _hf(model, _windows(model))
    assert len(hs) == model.n_layers + 1  # RWKV's hidden_states[l] is block l's output as passed on
    for l in range(model.n_layers):
        assert _diff(store.get("resid_post", l), hs[l]) <= ATOL, l
    for l in range(1, model.n_layers):
        assert _diff(store.get("resid_pre", l), store.get("resid_post", l - 1)) <= ATOL, l
    assert _diff(store.get("final_norm", None), hs[-1]) <= ATOL
    assert _diff(model.decode(store.get("resid_post", model.n_layers - 1)), logits) <= 1e-4


def test_rwkv_rescaled_before_its_final_norm():
    model = lens.load_model(build_tiny("rwkv", rescale_every=1))  # every block, the last one included
    assert model.card().site_scales == {"resid_post": [0.5, 0.5, 0.5]}
    store = _capture(model, ["resid_post", "final_norm"])
    hs, logits = _hf(model, _windows(model))
    assert _diff(store.get("resid_post", model.n_layers - 1), hs[model.n_layers - 1]) <= ATOL
    assert _diff(model.decode(store.get("resid_post", model.n_layers - 1)), logits) <= 1e-4


def test_minicpm_scaled_sub_blocks_are_captured_as_added_to_the_stream():
    model = lens.load_model("tiny:minicpm3")
    card = model.card()
    cfg = model.hf_model.config
    c = cfg.scale_depth / math.sqrt(cfg.num_hidden_layers)
    assert card.block.value == "sequential" and set(card.site_scales) == {"attn_out", "mlp_out"}
    for site in ("attn_out", "mlp_out"):
        assert all(abs(v - c) <= 1e-6 * c for v in card.site_scales[site]), card.site_scales
    store = _capture(model, list(card.sites))
    hs, logits = _hf(model, _windows(model))
    assert _diff(store.get("embed", None), hs[0]) <= ATOL
    for l in range(model.n_layers):
        pre, mid, post = (store.get(s, l) for s in ("resid_pre", "resid_mid", "resid_post"))
        if l < model.n_layers - 1:
            assert _diff(post, hs[l + 1]) <= ATOL, l
        assert _diff(mid, pre + store.get("attn_out", l)) <= ATOL, l
        assert _diff(post, mid + store.get("mlp_out", l)) <= ATOL, l
    assert card.has_lm_head
    assert _diff(model.decode(store.get("resid_post", model.n_layers - 1)), logits) <= 1e-4
