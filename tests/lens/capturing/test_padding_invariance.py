"""Padding invariance, checked by the architecture probe: a family whose states change when a row is
padded (ConvBERT: its convolution mixes the padding into the real positions) is captured without padding
and equal to Hugging Face's unpadded forward; a padding-invariant family batches with padding as before."""

from __future__ import annotations

import json

import torch

import lens
from app.commands.cli import main
from lens.capturing.backends import make_backend
from lens.capturing.backends.native import NativeBackend
from lens.capturing.fidelity import FORWARDS
from lens.capturing.unpadded import EqualLengths
from lens.sites import HookSite, Site
from lens.text.corpora import load_corpus, make_windows

SEQ, MAX_TOKENS, BATCH = 64, 400, 4  # lee at 64 / 400 tokens: six full windows, then 11 and 5 tokens


def _windows(model):
    win = make_windows(load_corpus("lee"), model.tokenizer, seq_len=SEQ, max_tokens=MAX_TOKENS,
                       is_causal=model.is_causal)
    lengths = [len(w) for w in win.input_ids]
    batches = [lengths[i:i + BATCH] for i in range(0, len(lengths), BATCH)]
    assert any(len(set(b)) > 1 for b in batches), lengths  # a short window shares a batch with longer ones
    return win


def _hf_hidden(model, win, padded: bool):
    """Hugging Face's hidden states for every window, real tokens in window order: each window alone, or
    in the capture's padded batches."""
    hf, pad = model.hf_model, model.tokenizer.pad_token_id or 0
    rows = []
    with torch.inference_mode():
        if not padded:
            for w in win.input_ids:
                ids = torch.as_tensor(list(w))[None]
                rows.append(torch.stack(hf(input_ids=ids, attention_mask=torch.ones_like(ids),
                                           output_hidden_states=True).hidden_states)[:, 0])
        else:
            for lo in range(0, win.n_windows, BATCH):
                chunk = win.input_ids[lo:lo + BATCH]
                width = max(map(len, chunk))
                ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                mask = torch.zeros_like(ids)
                for i, c in enumerate(chunk):
                    ids[i, :len(c)], mask[i, :len(c)] = torch.as_tensor(c), 1
                hs = torch.stack(hf(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states)
                rows.append(hs[:, mask.bool()])
    return torch.cat(rows, dim=1)  # (layers + 1, tokens, d)


def test_convbert_is_found_not_padding_invariant_and_captured_equal_to_its_unpadded_forward():
    model = lens.load_model("tiny:convbert")
    assert model.site_map.padding_invariant is False and model.card().padding_invariant is False
    assert any("not padding-invariant" in n for n in model.site_map.notes)
    win = _windows(model)
    alone, padded = _hf_hidden(model, win, padded=False), _hf_hidden(model, win, padded=True)
    assert float((alone - padded).abs().max()) > 1e-3  # what a padded capture would have stored
    store = lens.capture(model, corpus="lee", sites=["embed", "resid_post"], seq_len=SEQ, max_tokens=MAX_TOKENS,
                         batch_size=BATCH, progress=False)
    assert store.n_tokens == alone.shape[1]
    assert float((store.get("embed", None) - alone[0]).abs().max()) <= 1e-5
    for layer in range(model.n_layers):
        assert float((store.get("resid_post", layer) - alone[layer + 1]).abs().max()) <= 1e-5, layer
    assert store.manifest["model"]["padding_invariant"] is False


def test_a_padding_invariant_family_batches_with_padding_as_before():
    model = lens.load_model("tiny:gpt2")
    assert model.site_map.padding_invariant is True
    hooks = [HookSite(Site.RESID_POST, 0)]
    assert isinstance(make_backend("native", model, hooks), NativeBackend)  # no regrouping, no extra forward
    assert isinstance(make_backend("native", lens.load_model("tiny:convbert"), hooks), EqualLengths)
    win = _windows(model)
    calls = []
    handle = model.hf_model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        store = lens.capture(model, corpus="lee", sites=["resid_post"], layers=[0], seq_len=SEQ,
                             max_tokens=MAX_TOKENS, batch_size=BATCH, progress=False)
    finally:
        handle.remove()
    # one forward per padded batch, and the fidelity check's (lens.capturing.fidelity) before them
    assert len(calls) == -(-win.n_windows // BATCH) + FORWARDS
    padded = _hf_hidden(model, win, padded=True)
    assert float((store.get("resid_post", 0) - padded[1]).abs().max()) <= 1e-5


def test_inspect_shows_padding_invariance(capsys):
    assert main(["inspect", "tiny:convbert", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["padding_invariant"] is False
    assert main(["inspect", "tiny:convbert"]) == 0
    assert "NOT invariant: captured without padding" in capsys.readouterr().out
