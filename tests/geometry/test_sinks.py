"""Attention sinks and massive activations (issue #40): a planted massive channel is found with its known max /
median ratio and its position; the share of attention to the first position equals Hugging Face's own attention
weights, and is said absent under SDPA and in a family without attention; the one token filter every geometry
study shares (skip_first) with its stated default, recorded in each result; the anisotropy study's sink table."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lens.errors import LensInputError


def test_a_planted_massive_activation_is_found_with_its_ratio_and_position():
    from geometry.sinks import massive_activations

    rng = np.random.default_rng(0)
    n, d = 400, 32
    pos = np.tile(np.arange(20), n // 20)
    layers = []
    for scale in (1.0, 300.0):
        x = rng.choice([-1.0, 1.0], size=(n, d))  # |x| = 1 everywhere: the median is 1
        x[pos == 0, 7] = scale * 2  # channel 7 at every first position
        x[5, 3] = 1.5  # a mild second channel elsewhere
        layers.append(x)
    r = massive_activations(layers, pos, k=2)
    assert r.channel[1, 0] == 7 and r.position[1, 0] == 0 and r.first_share[1, 0] == 1.0
    np.testing.assert_allclose(r.median_abs, [1.0, 1.0])
    np.testing.assert_allclose(r.ratio[:, 0], [2.0, 600.0])
    assert r.channel[0, 1] == 3 or r.channel[1, 1] == 3
    assert r.first_norm_ratio[1] > 100 and r.ratio.shape == (2, 2)
    with pytest.raises(ValueError):
        massive_activations([np.ones((3, 4))], np.arange(5))


def test_attention_to_the_first_position_equals_hugging_faces_weights(tiny_llama):
    from lens.capturing.attention_sinks import first_position_attention

    rng = np.random.default_rng(1)
    wins = [rng.integers(5, 1000, size=n) for n in (12, 9, 12, 7)]
    r = first_position_attention(tiny_llama, wins, batch_size=3)
    ref, n = 0, 0
    for w in wins:
        with torch.no_grad():
            att = torch.stack(tiny_llama.hf_model(input_ids=torch.tensor(w[None]), output_attentions=True).attentions)
        ref = ref + att[:, 0, :, 1:, 0].double().sum(-1)
        n += len(w) - 1
    assert r.n_queries == n and r.absent == ""
    np.testing.assert_allclose(r.share, ref.numpy() / n, atol=1e-6)
    assert r.per_layer.shape == (tiny_llama.n_layers,)


def test_attention_shares_are_said_absent_where_there_are_no_weights():
    import lens
    from lens.capturing.attention_sinks import first_position_attention
    from lens.model.tiny import build_tiny

    sdpa = lens.load_model("tiny-llama", attn_implementation="sdpa")
    r = first_position_attention(sdpa, [np.arange(5, 15)])
    assert r.share is None and r.absent.startswith("absent") and "sdpa" in r.absent and "eager" in r.absent
    mamba = lens.load_model(build_tiny("mamba"))
    r = first_position_attention(mamba, [np.arange(5, 15)])
    assert r.share is None and "no attention module" in r.absent


def test_one_token_filter_with_a_stated_default_for_every_geometry_study():
    from studies.anisotropy.study import Config as Aniso
    from studies.core.config import SKIP_FIRST_DEFAULT, TokenFilterConfig
    from studies.intrinsic_dim.study import Config as ID
    from studies.linearity.study import Config as Lin

    assert SKIP_FIRST_DEFAULT == 1
    for cls in (Aniso, ID, Lin):
        assert issubclass(cls, TokenFilterConfig) and not hasattr(cls(), "min_pos")
    assert Aniso().skip_first == ID().skip_first == SKIP_FIRST_DEFAULT
    assert Lin().skip_first == 0 and Lin().drop_special is False  # the paper scores every token: said in its config
    assert "skip_first=1" in Aniso().token_filter() and "position 0" in Aniso().token_filter()
    assert "every position kept" in Lin().token_filter()
    assert "0..2" in ID(skip_first=3).token_filter()
    for bad in (-1, 1.5, True):
        with pytest.raises(LensInputError, match="skip_first"):
            Aniso(skip_first=bad)


def test_the_filter_keeps_the_stores_rows_and_a_result_records_it(tmp_path):
    import lens
    from studies.anisotropy.study import Config
    from studies.core.runner import run_study

    config = Config(model="tiny-llama", max_tokens=300, seq_len=64, null_draws=19, n_boot=20, progress=False,
                    sink_tokens=256, sink_attention_tokens=128, skip_first=2, store=str(tmp_path / "store"))
    out = run_study("anisotropy", config, tmp_path / "aniso")
    store = lens.open_store(tmp_path / "store")
    keep = config.token_mask(store)
    pos = np.asarray(store.tokens["pos"])
    assert not keep[pos < 2].any() and keep[pos >= 2].any()
    np.testing.assert_array_equal(keep, store.mask(True, 2))
    r = json.loads((out / "result.json").read_text())
    assert r["extra"]["token_filter"].startswith("skip_first=2") and r["config"]["skip_first"] == 2
    s, m = r["summary"], r["metrics"]
    assert s["sink_attention"].startswith("present") and len(m["first_position_attention"]) == len(r["layers"])
    assert s["sink_tokens"] >= 256 and len(m["sink_top_ratio"]) == len(r["layers"])
    assert all(v >= 1 for v in m["sink_top_ratio"])  # a channel's max |x| is at least the median |x|
    assert (out / "figures").exists() or list(out.glob("*sinks*"))
