"""Every GGUF architecture the installed transformers reads loads through ``lens.load_model(path.gguf)``.

For each architecture of :func:`lens.model.gguf.architectures` a tiny F32 GGUF file is written from a tiny random
model (``tests/lens/gguf_factory.py``), loaded through the workbench's own path (dequantise once into the
cache, reload the fp32 folder, derive the site map), and checked: the loaded weights equal the source's,
the loaded model computes the source's logits, every site of its card captures, and the logit lens of
the last layer equals the model's logits. Files with quantised weight matrices load as the values their
storage type reads back as; sentencepiece vocabularies survive the cached copy. Refusals (an architecture
transformers cannot read, one the workbench refuses, tensors that do not fit, bytes that are not GGUF) are
one clear ``LensInputError`` each, exit 2 in the CLI. A few parametrisations that add breadth are marked
``families`` and left out of the quick loop (``-m "not families"``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoConfig

import lens
from lens.model.card import BlockKind
from lens.errors import LensInputError
from lens.model.gguf import READER_MISSES, REFUSED, architectures
from lens.model.loading import smollm2_gguf_path
from lens.readout.logit_lens import last_layer_logit_diff
from tests.lens.gguf_factory import write_gguf, write_tiny_gguf

pytestmark = pytest.mark.skipif(smollm2_gguf_path() is None, reason="the tiny GGUF files borrow SmolLM2's tokenizer")

ARCHS = architectures()

# The block each architecture's tiny model derives. LFM2 is written with convolution and attention
# layers, Qwen 3.5 with linear and full attention: hybrids, no decomposition holds at every layer.
# Gemma 4: the block scales its output (layer_scalar) and adds a per-layer input, so no attention / MLP
# decomposition is found either (its four residual sites are mapped and the lens is exact).
BLOCKS = {
    **{a: BlockKind.SEQUENTIAL for a in ("llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3", "bloom", "gpt2",
                                         "stablelm", "starcoder2", "nemotron", "minimax-m2")},
    **{a: BlockKind.SANDWICH for a in ("gemma2", "gemma3")},
    "falcon": BlockKind.PARALLEL,
    **{a: BlockKind.RECURRENT for a in ("mamba", "lfm2", "qwen35", "qwen35moe", "gemma4")},
}
MOE = {"qwen2moe", "qwen3moe", "minimax-m2"}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LENS_CACHE_DIR", str(tmp_path / "cache"))


def test_every_architecture_transformers_reads_is_tested_or_refused():
    assert set(BLOCKS) == set(ARCHS), "an architecture without a test, or a test for one that no longer loads"
    assert {"llama", "qwen2", "qwen3", "gemma3", "phi3", "gpt2"} <= set(ARCHS)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_gguf_loads_equals_its_source_captures_and_decodes(arch, tmp_path):
    tiny = write_tiny_gguf(arch, ARCHS[arch], tmp_path)
    model = lens.load_model(tiny.path)
    # sizes transformers' reader leaves at their defaults are read by the workbench (tiny, not the default)
    for field in READER_MISSES.get(arch, {}).values():
        default = getattr(AutoConfig.for_model(ARCHS[arch]), field)
        assert getattr(model.hf_model.config, field) == getattr(tiny.source.config, field) != default, field
    # the loaded weights are the source's, and so is what the model computes
    loaded = model.hf_model.state_dict()
    for name, want in tiny.source.state_dict().items():
        torch.testing.assert_close(loaded[name], want, atol=1e-6, rtol=0, msg=lambda m: f"{arch} {name}: {m}")
    ids = torch.tensor([[1, 300, 400, 500, 600, 700, 800, 900]])
    with torch.inference_mode():
        torch.testing.assert_close(model.hf_model(input_ids=ids).logits, tiny.source(input_ids=ids).logits,
                                   atol=1e-5, rtol=0)
    # the site map derives
    card = model.card()
    assert card.model_type == ARCHS[arch] and card.block is BLOCKS[arch], (card.model_type, card.block)
    assert {"embed", "resid_pre", "resid_post", "final_norm"} <= set(card.sites)
    assert ("router_logits" in card.sites) == (arch in MOE)
    assert card.has_lm_head, card.head_note
    # every site captures, and the last layer decoded through the lens is the model's logits
    store = lens.capture(model, corpus="lee", sites=list(card.sites), max_tokens=64, seq_len=16, progress=False)
    assert set(card.sites) <= set(store.sites) and store.n_tokens >= 16
    final = store.get(layer=model.n_layers - 1, site="resid_post")
    diff = last_layer_logit_diff(model, final, store.tokens["token_id"], store.tokens["window"])
    assert diff <= 1e-4, diff


# The largest error each storage type allows, relative to the largest magnitude in the tensor: half a unit
# in the last place (F16, BF16), half a quantisation step (Q8_0: amax / 127), or a whole one where Q4_0
# clips the side opposite its signed maximum (amax / 8); a little more for the F16 scale.
STORAGE_ERROR = {"F16": 2.0 ** -11, "BF16": 2.0 ** -8, "Q8_0": 1 / 254 + 2.0 ** -11, "Q4_0": 1 / 8 + 2.0 ** -11,
                 "Q5_0": 1 / 16 + 2.0 ** -11}


# the breadth beyond Llama's four storage types runs with the family matrix (-m families), not in the quick loop
FAMILIES = pytest.mark.families


# Q5_0: a type transformers' GGUF quantizer lacks (Gemma 3 270M's Q4_K_M file holds 81 such tensors); it loads
# through the gguf package's dequantiser instead (lens.model.gguf.quantizer_reads)
@pytest.mark.parametrize("arch,qtype", [("llama", "F16"), ("llama", "BF16"), ("llama", "Q8_0"), ("llama", "Q4_0"),
                                        ("llama", "Q5_0"),
                                        pytest.param("gemma3", "Q8_0", marks=FAMILIES),
                                        pytest.param("qwen3moe", "Q4_0", marks=FAMILIES),
                                        pytest.param("qwen35", "Q8_0", marks=FAMILIES)])
def test_quantised_gguf_loads_the_values_it_stores(arch, qtype, tmp_path):
    """A file whose weight matrices are stored quantised loads as the values gguf's reference code reads
    back from them (its F32 twin), and those are the source's within what the storage type allows.
    Llama (q/k permuted after dequantising), Gemma 3 (norms stored as w + 1), stacked MoE experts and a
    newer-reader architecture (rows concatenated and permuted after dequantising)."""
    tiny = write_tiny_gguf(arch, ARCHS[arch], tmp_path, qtype=qtype)
    model, twin = lens.load_model(tiny.path), lens.load_model(tiny.reference)
    loaded, expected = model.hf_model.state_dict(), twin.hf_model.state_dict()
    stored = 0
    for name, source in tiny.source.state_dict().items():
        torch.testing.assert_close(loaded[name], expected[name], atol=0, rtol=0, msg=lambda m: f"{name}: {m}")
        error = (loaded[name] - source).abs().max().item()
        assert error <= STORAGE_ERROR[qtype] * source.abs().max().item() * (1 + 1e-6), (name, error)
        stored += error > 0
    assert stored, "no tensor was stored quantised"
    ids = torch.tensor([[1, 300, 400, 500, 600, 700, 800, 900]])
    with torch.inference_mode():
        torch.testing.assert_close(model.hf_model(input_ids=ids).logits, twin.hf_model(input_ids=ids).logits,
                                   atol=1e-5, rtol=0)


def test_sizes_the_reader_misses_are_refused_naming_the_tensor_not_left_random(tmp_path, monkeypatch):
    """Without the workbench reading the expert widths, transformers builds Qwen2-MoE at its default widths;
    the file's tensors do not fit, and the load is one clear refusal (not transformers' load report)."""
    import lens.model.gguf

    tiny = write_tiny_gguf("qwen2moe", "qwen2_moe", tmp_path)
    monkeypatch.setattr(lens.model.gguf, "READER_MISSES", {})
    with pytest.raises(LensInputError, match=r"do not fit the model .*\.mlp\.(shared_expert|experts)") as err:
        lens.load_model(tiny.path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("arch,tokenizer", [("gemma3", "llama"), pytest.param("phi3", "llama", marks=FAMILIES),
                                            pytest.param("gemma4", "gemma4", marks=FAMILIES)])
def test_sentencepiece_vocabularies_survive_the_cache(arch, tokenizer, tmp_path):
    """Gemma, Phi-3 and Gemma 4 files carry sentencepiece vocabularies, each built by its own transformers
    class or builder; the copy the workbench caches encodes as the tokenizer transformers builds from the
    file, and the model captures with it."""
    from transformers import AutoTokenizer

    tiny = write_tiny_gguf(arch, ARCHS[arch], tmp_path, tokenizer=tokenizer)
    model = lens.load_model(tiny.path)
    direct = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=tiny.path.name)
    text = "The quick brown fox jumps over the lazy dog.  Two spaces, 1234 and bytes: \u00fcn\u00efcode."
    ids = direct(text)["input_ids"]
    assert model.tokenizer(text)["input_ids"] == ids and len(ids) > 20
    assert "\u2581" in "".join(direct.convert_ids_to_tokens(ids)), "not a sentencepiece vocabulary"
    store = lens.capture(model, corpus="lee", sites=["resid_post"], max_tokens=32, seq_len=16, progress=False)
    assert store.n_tokens >= 16


@pytest.mark.parametrize("name", ["mistral", "Mistral 7B Instruct v0.3"])
def test_mistral_gguf_loads_as_the_llama_it_is_written_as(name, tmp_path):
    """llama.cpp writes Mistral as ``llama``; transformers reads a file named exactly ``mistral`` as a
    Mistral config and then finds no tensor table for it — the workbench loads it as Llama."""
    tiny = write_tiny_gguf("llama", "mistral", tmp_path, name=name)
    model = lens.load_model(tiny.path)
    assert model.family == "llama"
    ids = torch.tensor([[1, 300, 400, 500]])
    with torch.inference_mode():
        torch.testing.assert_close(model.hf_model(input_ids=ids).logits, tiny.source(input_ids=ids).logits,
                                   atol=1e-5, rtol=0)


def _header_only(tmp_path, arch: str):
    return write_gguf(tmp_path / f"{arch}.gguf", arch, {}, {}, f"tiny {arch}")


@pytest.mark.parametrize("arch,why", [("rwkv7", "transformers has no GGUF reader"), ("mpt", "transformers has no GGUF reader"),
                                      ("t5", "encoder-decoder"), ("t5encoder", "T5EncoderModel"),
                                      ("deci", "no DeciLM model class"), ("gpt-oss", "stacked experts")])
def test_unsupported_architecture_is_refused_naming_it_and_what_loads(arch, why, tmp_path):
    with pytest.raises(LensInputError) as err:
        lens.load_model(_header_only(tmp_path, arch))
    message = str(err.value)
    assert f"'{arch}'" in message and why in message and "\n" not in message
    assert "llama, " in message and "gemma3" in message and "qwen3" in message  # the list of what loads


def test_gpt_oss_is_refused_because_transformers_still_cannot_map_its_experts():
    """When transformers learns to map GPT-OSS's experts this fails: drop the refusal and test it."""
    from transformers.modeling_gguf_pytorch_utils import GptOssTensorProcessor, get_gguf_hf_weights_map

    from tests.lens.gguf_factory import build_source

    assert "gpt-oss" in REFUSED
    model = build_source("gpt-oss", "gpt_oss")
    mapped = set(get_gguf_hf_weights_map(model, GptOssTensorProcessor(), model_type="gpt-oss").values())
    assert "model.layers.0.mlp.experts.gate_up_proj" not in mapped


def test_bytes_that_are_not_gguf_are_refused(tmp_path):
    garbage = tmp_path / "model.gguf"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(LensInputError, match="is not a GGUF file"):
        lens.load_model(garbage)
    truncated = tmp_path / "truncated.gguf"  # the right magic bytes, then a header cut short
    truncated.write_bytes(_header_only(tmp_path, "llama").read_bytes()[:200])
    with pytest.raises(LensInputError, match="damaged or truncated"):
        lens.load_model(truncated)


def test_cli_refusal_is_exit_2_with_one_line(tmp_path, capsys):
    from app.commands.cli import main

    garbage = tmp_path / "model.gguf"
    garbage.write_bytes(b"not a model at all" * 64)
    assert main(["inspect", str(garbage)]) == 2
    assert main(["inspect", str(_header_only(tmp_path, "rwkv7"))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "not a GGUF file" in err[0] and "'rwkv7'" in err[1], err
