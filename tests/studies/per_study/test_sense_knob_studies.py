"""senses, filler-tokens and context-knob end to end on tiny-llama; the planted-knob known answers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.app.commands.test_cli import lens_cli


def _result(path):
    return json.loads((path / "result.json").read_text())


def _wordnet_or_skip():
    from lens.text import wordnet
    from lens.errors import LensInputError

    try:
        wordnet.find_wordnet()
    except LensInputError as e:
        pytest.skip(str(e))


def test_senses_cli(tmp_path):
    _wordnet_or_skip()
    out = lens_cli("study", "senses", "--model", "tiny-llama", "--max-tokens", "512", "--param", "max_lemmas=5",
                   "--param", "progress=false", "--out", tmp_path / "s")
    assert out.returncode == 0, out.stderr
    r = _result(tmp_path / "s")
    assert r["layers"] == [0, 1, 2, 3]
    assert {"knn_accuracy", "ari", "knn_accuracy__clip", "ari__standardize"} <= set(r["metrics"])
    s = r["summary"]
    for key in ("chance", "most_frequent_sense", "best_layer", "best_knn_accuracy", "n_lemmas", "n_contexts",
                "embedding_knn_accuracy"):
        assert key in s
    assert s["n_lemmas"] == 5 and 0 <= s["chance"] <= 1
    arrays = np.load(tmp_path / "s" / "arrays.npz", allow_pickle=False)
    lemma = str(arrays["projection_lemmas"][0])
    assert arrays[f"proj__{lemma}"].shape[:1] == (4,) and arrays[f"proj__{lemma}"].shape[2] == 2
    assert (tmp_path / "s" / "sense_dict.npz").is_file() and (tmp_path / "s" / "figure-projection.html").is_file()


def test_senses_bad_lemma_and_no_wordnet(tmp_path, monkeypatch):
    from app.commands.cli import main

    _wordnet_or_skip()
    assert main(["study", "senses", "--model", "tiny-llama", "--param", "lemmas=qwzxvbn", "--out",
                 str(tmp_path / "a")]) == 2
    monkeypatch.setenv("LENS_WORDNET_DIR", str(tmp_path))
    assert main(["study", "senses", "--model", "tiny-llama", "--out", str(tmp_path / "b")]) == 2


def test_filler_tokens_cli(tmp_path):
    from app.commands.cli import main  # in process: the console script's code path without a new interpreter

    assert main(["study", "filler-tokens", "--model", "tiny-llama", "--corpus", "lee", "--max-tokens", "300",
                 "--seq-len", "64", "--param", "n_random=1", "--param", "progress=false",
                 "--out", str(tmp_path / "f")]) == 0
    s = _result(tmp_path / "f")["summary"]
    for key in ("delta_loss_filler", "delta_loss_random", "loss_original", "loss_filler", "loss_random"):
        assert np.isfinite(s[key])
    assert np.isclose(s["delta_loss_filler"], s["loss_filler"] - s["loss_original"])
    assert 0 < s["removed_share"] < 1


def test_filler_tokens_bad_class(tmp_path):
    from app.commands.cli import main

    assert main(["study", "filler-tokens", "--model", "tiny-llama", "--param", "classes=nonsense",
                 "--out", str(tmp_path / "x")]) == 2


def test_context_knob_cli_and_unknown_facts(tmp_path):
    from app.commands.cli import main

    assert main(["study", "context-knob", "--model", "tiny-llama", "--param", "max_facts=10", "--param",
                 "require_known=false", "--param", "n_steer=2", "--param", "alphas=0,1", "--param",
                 "progress=false", "--out", str(tmp_path / "k")]) == 0
    r = _result(tmp_path / "k")
    assert len(r["metrics"]["separation"]) == 4
    for key in ("knob_layer", "baseline_context_share", "steered_context_share_min", "steered_context_share_max"):
        assert key in r["summary"]
    # a random model knows no capital: the default (known facts only) refuses with a clear message
    assert main(["study", "context-knob", "--model", "tiny-llama", "--param", "max_facts=12",
                 "--out", str(tmp_path / "u")]) == 2


# ---------------------------------------------------------------- planted knob (known answers)

def test_planted_knob_on_arrays_is_found_at_its_layer():
    from probes.knob import KnobProbe

    rng = np.random.default_rng(0)
    n, d, planted_layer = 60, 32, 3
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    cond = np.repeat([0, 1], n // 2)
    X = rng.normal(size=(6, n, d))
    X[planted_layer] += np.outer(np.where(cond == 1, 3.0, -3.0), u)
    res = KnobProbe().fit(X, cond).result_
    assert res.best_layer == planted_layer and res.separation[planted_layer] == 1.0
    assert abs(res.direction[planted_layer] @ u) > 0.9
    assert np.all(np.delete(res.separation, planted_layer) < 0.8)


def test_planted_knob_in_tiny_llama_is_found_and_steering_flips_the_output(tiny_llama):
    from lens.capturing.spans import last_token_states
    from lens.interventions.steering import next_token_logits
    from probes.knob import KnobProbe

    model, L = tiny_llama, 1
    rng = np.random.default_rng(0)
    u = rng.normal(size=model.d_model)
    u /= np.linalg.norm(u)
    ut = torch.tensor(u, dtype=torch.float32)
    prompts = [f"The capital of country {i} is" for i in range(12)]
    n_tok = [len(model.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]

    def plant(sign):  # add ±a·u to block L's output at the last token: a planted 1-D knob
        def hook(mod, args, out):
            h = out[0] if isinstance(out, tuple) else out
            h = h.clone()
            for i, n in enumerate(n_tok[:h.shape[0]]):
                h[i, n - 1] += sign * 40.0 * ut
            return (h,) + tuple(out[1:]) if isinstance(out, tuple) else h
        return model.layers[L].register_forward_hook(hook)

    states, logits = {}, {}
    for sign in (-1, 1):
        handle = plant(sign)
        try:
            states[sign] = last_token_states(model, prompts, batch_size=12)
            logits[sign] = next_token_logits(model, prompts, batch_size=12)
        finally:
            handle.remove()
    assert (logits[-1].argmax(-1) != logits[1].argmax(-1)).float().mean() > 0.8  # the knob matters
    X = np.concatenate([states[-1][1:], states[1][1:]], axis=1)  # resid_post layers
    cond = np.repeat(["low", "high"], len(prompts))
    res = KnobProbe(n_folds=4).fit(X, cond).result_
    assert np.all(res.separation[:L] <= 0.75)  # before the knob nothing separates the conditions
    assert res.separation[L] == 1.0 and res.best_layer >= L
    d = res.direction[L]
    assert abs(d @ u) > 0.95
    # steer the 'low' prompts to the 'high' mean coordinate at layer L: the output follows 'high'
    high_value = float(res.proj_mean[L][list(res.conditions).index("high")])
    handle = plant(-1)
    try:
        steered = next_token_logits(model, prompts, batch_size=12, steering=dict(layer=L, direction=d, value=high_value))
    finally:
        handle.remove()
    assert (steered.argmax(-1) == logits[1].argmax(-1)).float().mean() > 0.8


def test_context_knob_sweep_from_the_kv_cache_equals_whole_forward_passes(tmp_path, monkeypatch):
    """The steering sweep (the last token alone against the prefixes' KV cache) and the reused
    no-context logits give the results that whole forward passes per steering value give."""
    import lens
    import lens.interventions.steering
    from lens.interventions.steering import next_token_logits
    from studies.context_knob import study as ck
    from studies.reporting.results import read_result
    from studies.core.runner import run_study

    # float32: the shortcut equals whole forward passes up to float32 reordering (with bfloat16
    # products the two round differently and a near-tie of this random model can flip)
    cfg = ck.Config(model="tiny-llama", max_facts=10, require_known=False, n_steer=4, alphas=("0", "1"),
                    batch_size=6, progress=False, precision="float32")
    got = read_result(run_study("context-knob", cfg, tmp_path / "cached"))
    real = lens.interventions.steering.steering_sweeps
    monkeypatch.setattr(lens.interventions.steering, "steering_sweeps", lambda *a, **k: real(*a, **{**k, "method": "forward"}))
    ref = read_result(run_study("context-knob", cfg, tmp_path / "forward"))
    assert got.summary == ref.summary
    for name, arr in ref.arrays().items():
        if arr.dtype.kind in "fc":
            np.testing.assert_allclose(got.arrays()[name], arr, atol=1e-6, rtol=0, err_msg=name)
        else:
            assert np.array_equal(got.arrays()[name], arr), name
    # the no-context prompts of context-aware decoding are the fact-selection prompts: their logits are reused
    model = lens.load_model("tiny-llama")
    facts, counter, _, _, _, without = ck._select_facts(model, cfg)
    closed = ck.build_prompts(model.tokenizer, facts, counter)["closed"]
    torch.testing.assert_close(without, next_token_logits(model, closed, batch_size=cfg.batch_size), atol=1e-5, rtol=0)
