"""An import of a site that Hugging Face's hidden states do not expose (a SAELens cache of ``hook_resid_mid`` or
``hook_attn_out`` alone: the common SAE training sites) is verified against the workbench's own hook of that site
on the same windows, so a cache of another model of the same width is refused (tiny-gpt2 and tiny-llama both have
d_model 64), and token ids outside the model's vocabulary are refused before any forward or write."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lens
from lens.capturing.exchange import export_store, import_store
from lens.errors import LensInputError, SilentlyWrong
from lens.store.exchange.saelens import whole_windows
from lens.store.fidelity import SILENTLY_WRONG, own_hook, record_of, verdict_line
from tests.lens.store.exchange_helpers import cli, make_store, nothing_at, one_error_line


@pytest.fixture(scope="module")
def gpt2_caches(tiny_gpt2, tmp_path_factory):
    """tiny-gpt2's resid_mid and attn_out of layers 1 and 3, as SAELens caches (one hook each, as SAELens
    caches them)."""
    root = tmp_path_factory.mktemp("own-hooks")
    src = make_store(tiny_gpt2, root / "s", "float32", sites=["resid_mid", "attn_out"], layers="1,3")
    return src, {site: export_store(src, "saelens", root / site, sites=[site], layers="3") for site in
                 ("resid_mid", "attn_out")}


@pytest.mark.parametrize("site", ["resid_mid", "attn_out"])
def test_a_sub_block_site_alone_is_verified_against_the_own_hook(gpt2_caches, tiny_gpt2, tmp_path, site):
    src, caches = gpt2_caches
    back = lens.open_store(import_store(caches[site], "saelens", tmp_path / "r", model=tiny_gpt2))
    record = record_of(back.manifest)
    assert record.verdict == "ok", verdict_line(record)
    (check,) = [s for s in record.sites if s.site == site]
    assert check.against == own_hook(site) and check.layers == 1 and check.layer == 3
    assert check.max_rel is not None and check.max_rel <= record.tolerance
    assert verdict_line(record).startswith(f"ok: within {record.tolerance:g} of the workbench's own hooks")
    store = lens.open_store(src)
    starts, _ = whole_windows(store.tokens, store.manifest["settings"]["seq_len"])  # the cache's rows
    rows = (starts[:, None] + np.arange(store.manifest["settings"]["seq_len"])).reshape(-1)
    assert torch.equal(back.get(site, 3), store.get(site, 3, rows=rows))


def test_a_cache_of_another_model_of_the_same_width_is_refused(gpt2_caches, tiny_llama, tmp_path, capsys):
    _, caches = gpt2_caches
    assert tiny_llama.d_model == 64  # the width check alone would take it
    with pytest.raises(SilentlyWrong, match=r"resid_mid at layer 3 differs from the workbench's own resid_mid hook"):
        import_store(caches["resid_mid"], "saelens", tmp_path / "r", model=tiny_llama)
    assert nothing_at(tmp_path / "r")
    rc, _, err = cli(["store", "import", caches["attn_out"], "--from", "saelens", "--model", "tiny-llama", "--out",
                      tmp_path / "r", "--quiet"], capsys)
    assert rc == 2 and "do not match tiny-llama" in one_error_line(err) and nothing_at(tmp_path / "r")


def test_token_ids_outside_the_vocabulary_are_refused(tiny_llama, tmp_path, capsys):
    from safetensors.torch import save_file

    src = tmp_path / "hs"
    src.mkdir()
    vocab = tiny_llama.card().d_vocab
    ids = torch.tensor([1, 5, vocab + 7, 3])
    save_file({"hidden_states": torch.zeros(4, 1, tiny_llama.d_model), "token_ids": ids}, str(src / "r.safetensors"))
    argv = ["store", "import", src, "--from", "vllm", "--model", "tiny-llama", "--layers", "1", "--out",
            tmp_path / "s", "--quiet"]
    rc, _, err = cli(argv, capsys)  # the check's forward would fail on it
    assert rc == 2 and f"token id {vocab + 7} is outside tiny-llama's vocabulary" in one_error_line(err)
    assert nothing_at(tmp_path / "s")
    rc, _, err = cli(argv + ["--no-verify"], capsys)  # no forward: the write refuses it, and leaves nothing
    assert rc == 2 and f"token id {vocab + 7} is outside" in one_error_line(err) and nothing_at(tmp_path / "s")
    with pytest.raises(LensInputError, match="token id -2 is outside"):
        save_file({"hidden_states": torch.zeros(2, 1, tiny_llama.d_model), "token_ids": torch.tensor([4, -2])},
                  str(src / "r.safetensors"))
        import_store(src, "vllm", tmp_path / "s", model=tiny_llama, layers="1", verify=False)
    assert nothing_at(tmp_path / "s")


@pytest.mark.parametrize("model_type", ["llama", "gemma2", "gpt_neox", "falcon", "mixtral", "minicpm3", "roberta",
                                        "mamba"])
def test_each_block_kind_imports_its_own_sites_as_ok(model_type, tmp_path):
    """A one-site import of each sub-block site the family has (sequential, sandwich, parallel, Falcon's shared
    input, MoE with its router, scaled sub-blocks, post-norm encoder) matches the family's own hooks, and a family
    without the site says so: no false refusal; the same states labelled one layer deeper are refused. (Over the whole family matrix, 217 site imports: all ok.)"""
    from lens.capturing.import_check import check_import

    model = lens.load_model(f"tiny:{model_type}")
    card = model.card()
    sites = [s for s in ("resid_mid", "attn_out", "mlp_out", "router_logits") if s in card.sites]
    store = lens.capture(model, out=tmp_path / "s", corpus="lee", max_tokens=96, seq_len=32,
                         sites=sites or ["resid_post"], progress=False)
    probes = []
    for w in np.unique(store.tokens["window"])[:2]:
        rows = np.flatnonzero(store.tokens["window"] == w)
        probes.append((store.tokens["token_id"][rows],
                       {s: np.stack([store.get(s, l, rows=rows).float().numpy() for l in store.layers(s)])
                        for s in store.sites}))
    for site in sites:
        record = check_import(model, [(ids, {site: a[site]}) for ids, a in probes], {site: store.layers(site)},
                              "float32", "test")
        assert record.verdict == "ok", (site, verdict_line(record))
        layers = store.layers(site)  # the same states labelled one layer deeper: refused
        shifted = check_import(model, [(ids, {site: a[site][:-1]}) for ids, a in probes], {site: layers[1:]},
                               "float32", "test")
        assert shifted.verdict == SILENTLY_WRONG and f"differs from {own_hook(site)}" in shifted.failure, site
    if not sites:  # a state-space block: no sub-block site, and the site map says why
        assert "no attention + MLP decomposition" in card.absent["resid_mid"]
