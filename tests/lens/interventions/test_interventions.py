"""Layer deletion and swap: the model is bitwise restored (also after an exception), deleting an
identity block changes nothing, swapping two blocks equals running them in the other order by hand."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import lens
from lens.interventions.ablation import ablation_scan, delete_layer, next_token_scores, swap_layers


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
    win = lens.text.corpora.make_windows(lens.load_corpus("lee"), model.tokenizer, seq_len=32, max_tokens=128)
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


def test_next_token_scores_are_in_window_order(tiny_llama):
    """Windows of different lengths (batched longest first inside) come back in the order given,
    each equal to the model's own log-softmax at its targets."""
    model = tiny_llama
    rng = np.random.default_rng(3)
    wins = [rng.integers(0, model.d_vocab, size=n) for n in (5, 17, 9, 17, 2, 11)]
    tg = [np.where(rng.random(len(w)) < 0.7, rng.integers(0, model.d_vocab, size=len(w)), -1) for w in wins]
    tg[1][:] = -1  # a window with nothing to score
    got = next_token_scores(model, wins, tg, batch_size=4)
    want = []
    for w, t in zip(wins, tg):
        lp = torch.log_softmax(_logits(model, torch.as_tensor(w)[None])[0].double(), -1)
        keep = np.flatnonzero(t >= 0)
        want.append(lp[keep, t[keep]].numpy())
    np.testing.assert_allclose(got.logp, np.concatenate(want), atol=1e-5, rtol=0)
    assert np.array_equal(got.target, np.concatenate([t[t >= 0] for t in tg]))


def test_bad_layer(tiny_llama, tiny_bert):
    with pytest.raises(lens.LensInputError, match="0..3"):
        with delete_layer(tiny_llama, 4):
            pass
    with pytest.raises(lens.LensInputError, match="adjacent"):
        with swap_layers(tiny_llama, 3):
            pass
    with pytest.raises(lens.LensInputError, match="language-model head"):
        ablation_scan(tiny_bert, [np.array([1, 2, 3])], [np.array([2, 3, -1])])


def _texts(model, seq_len=24, max_tokens=200):
    win = lens.text.corpora.make_windows(lens.load_corpus("lee"), model.tokenizer, seq_len=seq_len, max_tokens=max_tokens)
    off = win.window_offsets()
    wins = list(win.input_ids)
    tg = [win.rows["next_token_id"][off[i]:off[i + 1]] for i in range(len(wins))]
    return wins, tg


_FIELDS = ("accuracy_delete", "accuracy_swap", "retained_accuracy_delete", "retained_accuracy_swap", "agreement_delete",
           "agreement_swap", "delta_ce_delete", "delta_ce_swap", "base_accuracy", "base_ce", "n_tokens")


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gpt2"])
def test_ablation_replay_equals_whole_forward_passes(name, request):
    """Variants run from the recorded block inputs (stacked, or one at a time) score exactly as whole
    forward passes under delete_layer / swap_layers do; windows of unequal length exercise the padding."""
    model = request.getfixturevalue(name)
    wins, tg = _texts(model)
    wins, tg = wins[:7] + [wins[7][:9]], tg[:7] + [tg[7][:9]]  # a short last window: padded rows
    ref = ablation_scan(model, wins, tg, batch_size=3, replay=False)
    for max_rows in (1, 10_000):
        got = ablation_scan(model, wins, tg, batch_size=3, replay=True, max_rows=max_rows)
        for f in _FIELDS:
            np.testing.assert_allclose(np.asarray(getattr(got, f), float), np.asarray(getattr(ref, f), float),
                                       atol=1e-5, rtol=0, err_msg=f)
    sub = ablation_scan(model, wins, tg, layers=[2, 3], batch_size=3, replay=True)  # recording starts at block 2
    np.testing.assert_allclose(sub.delta_ce_delete, ref.delta_ce_delete[2:], atol=1e-5, rtol=0)
    np.testing.assert_allclose(sub.accuracy_swap[0], ref.accuracy_swap[2], atol=1e-5, rtol=0)


def test_ablation_falls_back_when_blocks_do_not_replay(tiny_llama, monkeypatch, caplog):
    import lens.interventions.replay

    wins, tg = _texts(tiny_llama, max_tokens=60)
    ref = ablation_scan(tiny_llama, wins, tg, batch_size=2, replay=False)
    monkeypatch.setattr(lens.interventions.replay, "check_replay", lambda *a, **k: 1.0)
    with caplog.at_level("WARNING"):
        got = ablation_scan(tiny_llama, wins, tg, batch_size=2)
    assert "whole forward passes" in caplog.text
    np.testing.assert_allclose(got.delta_ce_swap, ref.delta_ce_swap, atol=1e-6)
    with pytest.raises(RuntimeError, match="differs"):
        ablation_scan(tiny_llama, wins, tg, batch_size=2, replay=True)


def test_replay_reproduces_the_forward_pass(tiny_llama, tiny_gpt2):
    from lens.interventions.ablation import _padded
    from lens.interventions.replay import check_replay, record_block_inputs

    for model in (tiny_llama, tiny_gpt2):
        wins, tg = _texts(model, max_tokens=80)
        ids, att, _ = _padded(model, wins[:3], tg[:3])
        rec = record_block_inputs(model, ids, att)
        assert check_replay(model, rec, copies=3) < 1e-5
        with torch.inference_mode():
            ref = model.hf_model(input_ids=ids, attention_mask=att, use_cache=False, output_hidden_states=True)
        # the recorded input of block 2 is the forward's hidden state after two blocks
        torch.testing.assert_close(rec.state(2), ref.hidden_states[2], atol=1e-6, rtol=0)
