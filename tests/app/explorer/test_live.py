"""The Live page's logit lens: the last layer is the model's own output, losses match Hugging Face."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def test_logit_lens_last_layer_is_the_model(tiny_llama):
    from app.explorer.live import logit_lens

    text = "The capital of France is Paris, and the capital of Italy is Rome."
    res = logit_lens(tiny_llama, text, k=3)
    ids = tiny_llama.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hf_loss = tiny_llama.hf_model(input_ids=ids, labels=ids).loss.item()
    n_layers = tiny_llama.n_layers
    assert res["loss"].shape == (n_layers, ids.shape[1])
    assert np.isnan(res["loss"][:, -1]).all()
    assert np.nanmean(res["loss"][-1]) == pytest.approx(hf_loss, rel=1e-4)
    assert res["topk_tokens"].shape == (n_layers, ids.shape[1], 3)
    assert (res["rank"][:, :-1] >= 0).all()
    assert "".join(res["tokens"]).strip().startswith("The capital")


def test_logit_lens_needs_two_tokens(tiny_llama):
    from app.explorer.live import logit_lens

    with pytest.raises(ValueError, match="two tokens"):
        logit_lens(tiny_llama, "")
