import subprocess
import sys

import pytest
import torch

import lens
from lens.errors import LensInputError


def test_tiny_models_have_their_explicit_sizes(tiny_llama, tiny_gpt2, tiny_bert):
    assert (tiny_llama.n_layers, tiny_llama.d_model, tiny_llama.d_vocab) == (4, 64, 49152)
    assert tiny_llama.family == "llama" and tiny_llama.is_causal and tiny_llama.has_lm_head
    # untied unembedding on the tiny Llama, so the lens is tested on both kinds
    assert tiny_llama.hf_model.lm_head.weight.data_ptr() != tiny_llama.hf_model.model.embed_tokens.weight.data_ptr()
    assert (tiny_gpt2.n_layers, tiny_gpt2.d_model, tiny_gpt2.family) == (4, 64, "gpt2")
    assert (tiny_bert.n_layers, tiny_bert.d_model, tiny_bert.family) == (3, 64, "bert")
    assert not tiny_bert.has_lm_head and not tiny_bert.is_causal


def test_tiny_models_are_deterministic(tiny_llama):
    again = lens.load_model("tiny-llama")
    for a, b in zip(tiny_llama.hf_model.parameters(), again.hf_model.parameters()):
        assert torch.equal(a, b)


def test_list_models_names_every_alias():
    names = {row["alias"] for row in lens.list_models()}
    assert {"smollm2-135m", "minilm-l6", "tiny-llama", "tiny-bert"} <= names


def test_unknown_alias_names_the_working_ones():
    with pytest.raises(LensInputError, match="smollm2-135m"):
        lens.load_model("no-such-model")


def test_missing_path(tmp_path):
    with pytest.raises(LensInputError, match="not found"):
        lens.load_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(LensInputError, match="unknown model"):
        lens.load_model(str(tmp_path / "missing_dir"))


def test_a_near_miss_alias_is_named():
    with pytest.raises(LensInputError, match=r"unknown model 'SmolLM-135M' \(did you mean 'smollm2-135m'\?\)"):
        lens.load_model("SmolLM-135M")
    with pytest.raises(LensInputError) as far:
        lens.load_model("no-such-model")
    assert "did you mean" not in str(far.value)


def test_directory_that_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(LensInputError, match="not a model directory"):
        lens.load_model(str(tmp_path))


def test_built_model_object_and_local_dir(tiny_llama, tmp_path):
    wrapped = lens.load_model(tiny_llama.hf_model, tokenizer=tiny_llama.tokenizer)
    assert wrapped.n_layers == 4 and wrapped.hf_model is tiny_llama.hf_model
    with pytest.raises(LensInputError, match="tokenizer"):
        lens.load_model(tiny_llama.hf_model)
    tiny_llama.hf_model.save_pretrained(tmp_path / "m")
    tiny_llama.tokenizer.save_pretrained(tmp_path / "m")
    local = lens.load_model(str(tmp_path / "m"))
    ids = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(local.hf_model(ids).logits, tiny_llama.hf_model(ids).logits)


def test_hub_id_offline_gives_a_clear_message():
    code = ("import lens\ntry:\n    lens.load_model('someone/some-model')\nexcept lens.LensInputError as e:\n"
            "    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert "ERR could not load 'someone/some-model'" in out.stdout
    assert "tiny-llama" in out.stdout


def test_encoder_has_no_logit_lens(tiny_bert):
    with pytest.raises(LensInputError, match="unembedding"):
        tiny_bert.decode(torch.zeros(1, 64))


@pytest.mark.slow
def test_smollm2_loads_from_the_packaged_gguf_and_knows_paris(smollm2):
    assert (smollm2.n_layers, smollm2.d_model, smollm2.d_vocab) == (30, 576, 49152)
    ids = smollm2.tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    logits = smollm2.hf_model(ids).logits[0, -1]
    assert smollm2.tokenizer.decode(int(logits.argmax())).strip() == "Paris"
    # the logit lens of the final state equals the model's logits
    torch.testing.assert_close(smollm2.decode(_last_resid(smollm2, ids))[0, -1], logits,
                               atol=1e-4, rtol=1e-5)


def _last_resid(model, ids):
    got = {}
    h = model.layers[-1].register_forward_hook(lambda m, i, o: got.__setitem__("x", o[0] if isinstance(o, tuple) else o))
    try:
        model.hf_model(ids)
    finally:
        h.remove()
    return got["x"]


@pytest.mark.slow
def test_smollm2_is_cached_as_fp32_safetensors():
    from lens.runtime.cache import cache_dir

    lens.load_model("smollm2-135m")
    cached = list((cache_dir() / "models").glob("smollm2-135m-*/model.safetensors"))
    assert cached and cached[0].stat().st_size > 400e6  # 135M params in fp32


@pytest.mark.slow
def test_minilm_is_the_packaged_encoder(minilm):
    assert (minilm.n_layers, minilm.d_model, minilm.family) == (6, 384, "bert")


def test_a_decoder_only_wrapper_maps_its_decoders_blocks():
    """BartForCausalLM keeps only the decoder: its config's layer count is the encoder's (3), its blocks are the
    decoder's 2 (this raised a NameError before the derivation looked for a list of the config's count)."""
    from transformers import BartConfig, BartForCausalLM

    from lens.model.arch import derive_site_map

    cfg = BartConfig(vocab_size=128, d_model=32, encoder_layers=3, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)
    model = BartForCausalLM(cfg).eval().requires_grad_(False)
    assert cfg.num_hidden_layers == 3
    site_map = derive_site_map(model)
    assert (site_map.n_layers, site_map.layers) == (2, "model.decoder.layers")
    assert site_map.verified and site_map.taps  # probed, with the residual sites mapped


def test_site_map_probe_finds_non_finite_weights_in_chunks_and_restores_them(tiny_llama, monkeypatch):
    """The probe forward zeroes NaN / inf weights and puts them back; the check runs in chunks, so a
    128k-word embedding costs no tensor-sized mask (it was 0.5 GB twice over for a 7B model), and an
    inf in any chunk, the last one included, is still found."""
    import torch

    from lens.model.arch import derive

    monkeypatch.setattr(derive, "FINITE_CHUNK", 1000)
    w = tiny_llama.hf_model.get_input_embeddings().weight
    assert w.numel() > 3000 and derive._all_finite(w)
    last = w.view(-1)[-1].item()
    with torch.no_grad():
        w.view(-1)[-1] = float("inf")
    try:
        assert not derive._all_finite(w)
        with derive._finite_weights(tiny_llama.hf_model) as n_bad:
            assert n_bad == 1 and torch.isfinite(w).all()
        assert w.view(-1)[-1].item() == float("inf")
    finally:
        with torch.no_grad():
            w.view(-1)[-1] = last
