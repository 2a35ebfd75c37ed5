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
    win = lens.corpora.make_windows(lens.load_corpus("lee"), model.tokenizer, seq_len=seq_len, max_tokens=max_tokens)
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
    import lens.replay

    wins, tg = _texts(tiny_llama, max_tokens=60)
    ref = ablation_scan(tiny_llama, wins, tg, batch_size=2, replay=False)
    monkeypatch.setattr(lens.replay, "check_replay", lambda *a, **k: 1.0)
    with caplog.at_level("WARNING"):
        got = ablation_scan(tiny_llama, wins, tg, batch_size=2)
    assert "whole forward passes" in caplog.text
    np.testing.assert_allclose(got.delta_ce_swap, ref.delta_ce_swap, atol=1e-6)
    with pytest.raises(RuntimeError, match="differs"):
        ablation_scan(tiny_llama, wins, tg, batch_size=2, replay=True)


def test_replay_reproduces_the_forward_pass(tiny_llama, tiny_gpt2):
    from lens.interventions import _padded
    from lens.replay import check_replay, record_block_inputs

    for model in (tiny_llama, tiny_gpt2):
        wins, tg = _texts(model, max_tokens=80)
        ids, att, _ = _padded(model, wins[:3], tg[:3])
        rec = record_block_inputs(model, ids, att)
        assert check_replay(model, rec, copies=3) < 1e-5
        with torch.inference_mode():
            ref = model.hf_model(input_ids=ids, attention_mask=att, use_cache=False, output_hidden_states=True)
        # the recorded input of block 2 is the forward's hidden state after two blocks
        torch.testing.assert_close(rec.state(2), ref.hidden_states[2], atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gpt2"])
@pytest.mark.parametrize("method", ["cache", "replay"])
def test_steering_sweep_equals_steered_forward_passes(name, method, request):
    from lens.interventions import steering_sweep
    from lens.steering import next_token_logits

    model = request.getfixturevalue(name)
    prompts = [f"The capital of country {i} is" + " very" * (i % 4) for i in range(7)]
    rng = np.random.default_rng(1)
    u = rng.normal(size=model.d_model)
    cols = rng.integers(0, model.d_vocab, size=(len(prompts), 3))
    values = [-20.0, 0.0, 35.0]
    rows = torch.arange(len(prompts))[:, None]
    for layer in (0, 2, model.n_layers - 1):
        base, swept = steering_sweep(model, prompts, layer, u, values, token_ids=cols, batch_size=3, max_rows=64,
                                     method=method)
        ref = next_token_logits(model, prompts, batch_size=3)[rows, torch.as_tensor(cols)].numpy()
        np.testing.assert_allclose(base, ref, atol=1e-5, rtol=0)
        for v, got in zip(values, swept):
            ref = next_token_logits(model, prompts, batch_size=3, steering=dict(layer=layer, direction=u, value=v))
            np.testing.assert_allclose(got, ref[rows, torch.as_tensor(cols)].numpy(), atol=1e-5, rtol=0)
    fwd = steering_sweep(model, prompts, 1, u, values, token_ids=cols, batch_size=3, method="forward")
    auto = steering_sweep(model, prompts, 1, u, values, token_ids=cols, batch_size=3)
    for a, b in zip(fwd, auto):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_steering_sweep_falls_back_when_the_cached_step_is_wrong(tiny_llama, monkeypatch, caplog):
    """A family whose cached last-token step does not reproduce the forward pass (here: the step
    made to see the wrong positions) is caught on the first batch, in float32; "auto" replays the
    blocks instead, "cache" refuses."""
    import logging

    import lens.prefix_cache as pc
    from lens.interventions import steering_sweep

    prompts = [f"The capital of country {i} is" + " very" * (i % 4) for i in range(5)]
    rng = np.random.default_rng(2)
    u, cols = rng.normal(size=tiny_llama.d_model), rng.integers(0, tiny_llama.d_vocab, size=(5, 2))
    ref = steering_sweep(tiny_llama, prompts, 1, u, [3.0], token_ids=cols, batch_size=2, method="replay")
    real = pc.left_padded

    def shifted(ids, pad):
        x, mask, pos = real(ids, pad)
        return x, mask, pos * 2  # the tokens twice as far apart: the rotary angles are wrong

    monkeypatch.setattr(pc, "left_padded", shifted)
    with caplog.at_level(logging.INFO, logger="lens.interventions"):
        got = steering_sweep(tiny_llama, prompts, 1, u, [3.0], token_ids=cols, batch_size=2)
    assert "differs from whole forward passes" in caplog.text
    for a, b in zip(ref, got):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    with pytest.raises(RuntimeError, match="cached last-token step differs"):
        steering_sweep(tiny_llama, prompts, 1, u, [3.0], token_ids=cols, batch_size=2, method="cache")
    with pytest.raises(lens.LensInputError, match="method: expected one of auto, cache, replay, forward"):
        steering_sweep(tiny_llama, prompts, 1, u, [3.0], token_ids=cols, method="kv")


def test_prefix_cache_needs_a_prefix(tiny_llama):
    """A one-token prompt has nothing to cache: the sweep replays (same numbers), "cache" refuses."""
    from lens.interventions import steering_sweep
    from lens.prefix_cache import PrefixCache

    with pytest.raises(ValueError, match="at least 2 tokens"):
        PrefixCache(tiny_llama, [[5, 6, 7], [8]])
    one = tiny_llama.tokenizer.decode([tiny_llama.tokenizer("Paris")["input_ids"][-1]])
    prompts = ["The capital of France is", "The capital of Peru is", one]
    assert len(tiny_llama.tokenizer(one, add_special_tokens=False)["input_ids"]) == 1
    rng = np.random.default_rng(4)
    u, cols = rng.normal(size=tiny_llama.d_model), rng.integers(0, tiny_llama.d_vocab, size=(3, 2))
    got = steering_sweep(tiny_llama, prompts, 1, u, [2.0], token_ids=cols, batch_size=2)
    ref = steering_sweep(tiny_llama, prompts, 1, u, [2.0], token_ids=cols, batch_size=2, method="forward")
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    with pytest.raises(RuntimeError, match="one-token prompt"):
        steering_sweep(tiny_llama, prompts, 1, u, [2.0], token_ids=cols, method="cache")
