"""A model split by accelerate (device_map / max_memory / offload_folder) captures the states of the whole one.

On CPU the split that can be forced is host memory + disk: modules past the memory budget are offloaded
to ``offload_folder`` and read back at each forward. Every backend must capture exactly what the
unsplit model gives (atol 1e-5 in fp32; in practice bit-identical).
"""

from __future__ import annotations


import pytest
import torch

import lens
from lens.errors import LensInputError

SITES = ["resid_post", "embed", "attn_out"]
KW = dict(corpus="lee", max_tokens=160, seq_len=32, batch_size=4, sites=SITES, progress=False)


def _budget(model) -> int:
    """Host memory for the embeddings and two and a half blocks: accelerate keeps room for the largest
    module (the embedding) on the main device, so blocks 2.. and the head go to disk."""
    hf = model.hf_model
    size = lambda m: sum(p.numel() * p.element_size() for p in m.parameters())  # noqa: E731
    return 2 * size(hf.get_input_embeddings()) + int(2.5 * size(model.layers[0]))


def _assert_same(a, b):
    for site in SITES:
        for layer in a.manifest["sites"][site]:
            torch.testing.assert_close(b.get(site, layer), a.get(site, layer), atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def offloaded(tiny_llama, tmp_path_factory):
    folder = tmp_path_factory.mktemp("offload")
    model = lens.load_model("tiny-llama", device_map="auto", max_memory={"cpu": _budget(tiny_llama)},
                            offload_folder=folder)
    placed = set(model.hf_model.hf_device_map.values())
    assert placed == {"cpu", "disk"}, model.hf_model.hf_device_map
    assert model.hf_model.hf_device_map["model.layers.0"] == "cpu" and model.hf_model.hf_device_map["lm_head"] == "disk"
    assert any(p.is_meta for p in model.hf_model.parameters())  # really offloaded, not just labelled
    return model


@pytest.mark.parametrize("backend", ["native", "nnsight", "transformer-lens"])
def test_every_backend_captures_an_offloaded_model_exactly(backend, offloaded, tiny_llama):
    assert offloaded.site_map == tiny_llama.site_map  # probed whole before it was split
    _assert_same(lens.capture(tiny_llama, backend=backend, **KW), lens.capture(offloaded, backend=backend, **KW))


def test_from_pretrained_gets_the_placement_and_a_disk_store_is_equal(tiny_llama, tmp_path):
    folder = tmp_path / "model"
    tiny_llama.hf_model.save_pretrained(folder)
    tiny_llama.tokenizer.save_pretrained(folder)
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                  "model.layers.1": "disk", "model.layers.2": "cpu", "model.layers.3": "disk",
                  "model.norm": "cpu", "lm_head": "disk"}
    split = lens.load_model(folder, device_map=device_map, offload_folder=tmp_path / "off")
    assert split.hf_model.hf_device_map == device_map
    assert split.site_map.verified and split.site_map == lens.load_model(folder).site_map  # probed through the hooks
    ref = lens.capture(tiny_llama, out=tmp_path / "ref", **KW)
    got = lens.capture(split, out=tmp_path / "got", **KW)
    _assert_same(ref, got)
    logits = split.hf_model(torch.tensor([[1, 2, 3]])).logits
    torch.testing.assert_close(logits, tiny_llama.hf_model(torch.tensor([[1, 2, 3]])).logits, atol=1e-5, rtol=0)


def test_placement_refusals(offloaded, tmp_path, capsys):
    cases = [
        (dict(device="cpu", device_map="auto"), "not both"),
        (dict(max_memory={"cpu": "1GB"}), "need device_map"),
        (dict(device_map="everywhere"), "unknown device_map"),
        (dict(device_map="auto", max_memory="cpu:1GB"), "--max-memory expects DEVICE=SIZE"),
        (dict(device_map="auto", max_memory={"gpu0": "1GB"}), "expected a GPU index"),
        (dict(device_map={"": "disk"}), "give offload_folder"),
    ]
    for kwargs, expect in cases:
        with pytest.raises(LensInputError, match=expect):
            lens.load_model("tiny-llama", **kwargs)
    with pytest.raises(LensInputError, match="split across devices"):
        lens.capture(offloaded, device="cpu", **KW)
    from app.commands.cli import main

    rc = main(["capture", "tiny-llama", "--device-map", "{bad", "--out", str(tmp_path / "s"), "--quiet"])
    assert rc == 2 and "--device-map is not a valid JSON object" in capsys.readouterr().err
