"""lens.interventions.steering.steering_sweep and lens.interventions.prefix_cache: every steering value scored on the last token
alone (against the prompts' KV cache) or from recorded block inputs equals whole steered forward
passes; a cached step that does not is caught on the first batch and routed around."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lens
from lens.interventions.steering import steering_sweep


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gpt2"])
@pytest.mark.parametrize("method", ["cache", "replay"])
def test_steering_sweep_equals_steered_forward_passes(name, method, request):
    from lens.interventions.steering import next_token_logits

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

    import lens.interventions.prefix_cache as pc

    prompts = [f"The capital of country {i} is" + " very" * (i % 4) for i in range(5)]
    rng = np.random.default_rng(2)
    u, cols = rng.normal(size=tiny_llama.d_model), rng.integers(0, tiny_llama.d_vocab, size=(5, 2))
    ref = steering_sweep(tiny_llama, prompts, 1, u, [3.0], token_ids=cols, batch_size=2, method="replay")
    real = pc.left_padded

    def shifted(ids, pad):
        x, mask, pos = real(ids, pad)
        return x, mask, pos * 2  # the tokens twice as far apart: the rotary angles are wrong

    monkeypatch.setattr(pc, "left_padded", shifted)
    with caplog.at_level(logging.INFO, logger="lens.interventions.steering"):
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
    from lens.interventions.prefix_cache import PrefixCache

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


def test_steering_sweeps_share_the_cache_and_equal_one_sweep_each(tiny_llama):
    """Several sweeps (layer, direction, values) of the same prompts in one pass over their prefixes give what
    each gives alone, the unsteered logits included; every method."""
    from lens.interventions.steering import steering_sweeps

    prompts = [f"The capital of country {i} is" + " very" * (i % 3) for i in range(5)]
    rng = np.random.default_rng(3)
    cols = rng.integers(0, tiny_llama.d_vocab, size=(5, 2))
    sweeps = [(0, rng.normal(size=tiny_llama.d_model), [-4.0, 9.0]),
              (tiny_llama.n_layers - 1, rng.normal(size=tiny_llama.d_model), [2.0]),
              (1, rng.normal(size=tiny_llama.d_model), [])]
    for method in ("cache", "replay", "forward"):
        base, swept = steering_sweeps(tiny_llama, prompts, sweeps, token_ids=cols, batch_size=2, method=method)
        assert len(swept) == len(sweeps)
        for (layer, u, values), got in zip(sweeps, swept):
            ref_base, ref = steering_sweep(tiny_llama, prompts, layer, u, values, token_ids=cols, batch_size=2,
                                           method="forward")
            np.testing.assert_allclose(base, ref_base, atol=1e-5, rtol=0)
            assert got.shape == ref.shape == (len(values), 5, 2)
            np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    with pytest.raises(lens.LensInputError, match="at least one"):
        steering_sweeps(tiny_llama, prompts, [], token_ids=cols)
