"""Layer deletion and swap: the model is bitwise restored (also after an exception), deleting an
identity block changes nothing, swapping two blocks equals running them in the other order by hand."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import lens
from lens.interventions import ablation_scan, delete_layer, next_token_scores, swap_layers


def _logits(model, ids):
    with torch.inference_mode():
        return model.hf_model(input_ids=ids, use_cache=False).logits.clone()


def _ids(model):
    return torch.as_tensor(model.tokenizer("Deleting one layer of a transformer keeps most of its accuracy.")["input_ids"])[None]


def _snapshot(model):
    return {k: v.detach().clone() for k, v in model.hf_model.state_dict().items()}


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gpt2"])
def test_restored_exactly_after_delete_and_swap(name, request):
    model = request.getfixturevalue(name)
    ids = _ids(model)
    before, params, order = _logits(model, ids), _snapshot(model), [id(b) for b in model.layers]
    # transformers keeps its own output-recording hooks once output_hidden_states was used: compare sets
    hooks = _hooks(model)
    with delete_layer(model, 1):
        deleted = _logits(model, ids)
    with swap_layers(model, 1):
        swapped = _logits(model, ids)
    assert not torch.equal(deleted, before) and not torch.equal(swapped, before)
    with pytest.raises(RuntimeError, match="boom"):
        with delete_layer(model, 2), swap_layers(model, 0):
            raise RuntimeError("boom")
    assert torch.equal(_logits(model, ids), before)
    assert [id(b) for b in model.layers] == order
    for k, v in model.hf_model.state_dict().items():
        assert torch.equal(v, params[k]), k
    assert _hooks(model) == hooks


def _hooks(model):
    return {(i, k) for i, b in enumerate(model.layers) for k in [*b._forward_hooks, *b._forward_pre_hooks]}


def test_delete_identity_block_changes_nothing(tiny_llama):
    model = copy.copy(tiny_llama)
    model.hf_model = copy.deepcopy(tiny_llama.hf_model)
    blk = model.layers[2]
    with torch.no_grad():  # zero the attention output and MLP down projections: the block is x -> x
        blk.self_attn.o_proj.weight.zero_()
        blk.mlp.down_proj.weight.zero_()
    ids = _ids(model)
    intact = _logits(model, ids)
    with delete_layer(model, 2):
        torch.testing.assert_close(_logits(model, ids), intact, atol=1e-6, rtol=0)


def test_swap_equals_manual_reorder(tiny_llama):
    model = copy.copy(tiny_llama)
    model.hf_model = copy.deepcopy(tiny_llama.hf_model)
    ids = _ids(model)
    with swap_layers(model, 0):
        swapped = _logits(model, ids)
    blocks = model.layers
    a, b = blocks[0], blocks[1]
    blocks[0], blocks[1] = copy.deepcopy(b), copy.deepcopy(a)
    torch.testing.assert_close(_logits(model, ids), swapped, atol=1e-6, rtol=0)


def test_ablation_scan(tiny_llama):
    model = tiny_llama
    win = lens.corpora.make_windows(lens.load_corpus("lee"), model.tokenizer, seq_len=32, max_tokens=128)
    wins = win.input_ids
    off = win.window_offsets()
    tg = [win.rows["next_token_id"][off[i]:off[i + 1]] for i in range(len(wins))]
    r = ablation_scan(model, wins, tg, batch_size=4)
    L = model.n_layers
    assert r.layers.tolist() == list(range(L)) and np.isnan(r.accuracy_swap[-1])
    assert np.all(np.isfinite(r.delta_ce_delete)) and np.all(np.isfinite(r.delta_ce_swap[:-1]))
    assert 0 <= r.base_accuracy <= 1 and r.n_tokens == int((win.rows["next_token_id"] >= 0).sum())
    # scores are batch-size invariant (right padding does not leak into causal positions)
    a = next_token_scores(model, wins, tg, batch_size=1)
    b = next_token_scores(model, wins, tg, batch_size=5)
    np.testing.assert_allclose(a.logp, b.logp, atol=1e-4)


def test_bad_layer(tiny_llama, tiny_bert):
    with pytest.raises(lens.LensInputError, match="0..3"):
        with delete_layer(tiny_llama, 4):
            pass
    with pytest.raises(lens.LensInputError, match="adjacent"):
        with swap_layers(tiny_llama, 3):
            pass
    with pytest.raises(lens.LensInputError, match="language-model head"):
        ablation_scan(tiny_bert, [np.array([1, 2, 3])], [np.array([2, 3, -1])])
