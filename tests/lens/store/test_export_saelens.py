"""The SAELens activation cache: written in the layout of SAELens' CacheActivationsRunner and read the way SAELens
reads it, imported back exactly; bad caches are one line, exit 2.

SAELens itself trains on the export in test_saelens_trains.py (sae-lens 6.54.12, installed with --no-deps: it pins
transformer-lens < 4, in a process of its own); here, fast, the reading side is SAELens' own code path with the library
it uses:
sae_lens/training/activations_store.py, ``ActivationsStore.load_cached_activation_dataset`` (``datasets.load_from_disk``,
``set_format(type="torch", columns=[hook_name, "token_ids"], dtype=...)``, the column's ``features[hook_name].shape``
checked against ``(context_size, d_in)``) and ``_load_buffer_from_cached`` (rows sliced, reshaped to
``(rows * context_size, d_in)`` with token ids ``(rows * context_size,)``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import lens
from lens.capturing.exchange import export_store, import_store
from lens.store.exchange.saelens import whole_windows
from tests.lens.store.exchange_helpers import cli, make_store, nothing_at, one_error_line


@pytest.fixture(scope="module")
def cache(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("saelens")
    src = make_store(tiny_llama, root / "s", "bfloat16")
    return src, export_store(src, "saelens", root / "c")


def _as_saelens_reads(folder, hook, context_size, d_in, dtype):
    """ActivationsStore.load_cached_activation_dataset and _load_buffer_from_cached, on the whole cache."""
    import datasets

    ds = datasets.load_from_disk(str(folder))
    ds.set_format(type="torch", columns=[hook, "token_ids"], device="cpu", dtype=dtype)
    assert ds.features[hook].shape == (context_size, d_in)
    rows = ds[0:len(ds)]
    return rows[hook].reshape(len(ds) * context_size, d_in), rows["token_ids"].reshape(len(ds) * context_size)


def test_cache_is_the_runners_layout_and_holds_our_states(cache):
    src, out = cache
    store = lens.open_store(src)
    ctx = store.manifest["settings"]["seq_len"]
    starts, short = whole_windows(store.tokens, ctx)
    info = json.loads((out / "lens_source.json").read_text())
    assert info["rows"] == len(starts) and info["short_windows_left_out"] == short and info["context_size"] == ctx
    folder = out / "resid_post.2"
    names = sorted(p.name for p in folder.iterdir())
    assert names[-2:] == ["dataset_info.json", "state.json"] and names[0].startswith("data-00000-of-")
    state = json.loads((folder / "state.json").read_text())
    assert state["_fingerprint"] and [f["filename"] for f in state["_data_files"]] == names[:-2]
    acts, token_ids = _as_saelens_reads(folder, "blocks.2.hook_resid_post", ctx, store.d_model, torch.float32)
    rows = (starts[:, None] + np.arange(ctx)).reshape(-1)
    assert torch.equal(acts, store.get("resid_post", 2, rows=rows).float())  # bfloat16 widened exactly
    assert np.array_equal(token_ids.numpy(), store.tokens["token_id"][rows])
    # SAELens may train in bfloat16: set_format converts back to the very values stored
    acts16, _ = _as_saelens_reads(folder, "blocks.2.hook_resid_post", ctx, store.d_model, torch.bfloat16)
    assert torch.equal(acts16, store.get("resid_post", 2, rows=rows))


def test_cache_imports_back(cache, tiny_llama, tmp_path):
    src, out = cache
    store = lens.open_store(src)
    back = lens.open_store(import_store(out, "saelens", tmp_path / "r", model=tiny_llama))
    assert back.manifest["fidelity"]["verdict"] == "ok" and back.manifest["imported"]["from"] == "saelens"
    assert back.layers("resid_post") == [0, 1, 2] and back.dtype == "float32"
    ctx = store.manifest["settings"]["seq_len"]
    starts, _ = whole_windows(store.tokens, ctx)
    rows = (starts[:, None] + np.arange(ctx)).reshape(-1)
    for layer in (0, 2):
        assert torch.equal(back.get("resid_post", layer), store.get("resid_post", layer, rows=rows).float())
    assert np.array_equal(back.tokens["token_id"], store.tokens["token_id"][rows])
    assert np.array_equal(back.tokens["token"], store.tokens["token"][rows].astype(back.tokens["token"].dtype))


def test_bad_caches_are_one_line(cache, tiny_llama, tmp_path, capsys):
    import datasets
    from datasets import Array2D, Dataset, Features, Sequence, Value

    _, out = cache
    ds = datasets.load_from_disk(str(out / "resid_post.1"))
    ds.remove_columns("token_ids").save_to_disk(str(tmp_path / "no_ids"))
    argv = ["store", "import", tmp_path / "no_ids", "--from", "saelens", "--model", "tiny-llama", "--out",
            tmp_path / "r", "--quiet"]
    rc, _, err = cli(argv, capsys)
    assert rc == 2 and "has no token_ids column" in one_error_line(err) and nothing_at(tmp_path / "r")
    feats = Features({"blocks.1.hook_resid_post": Array2D(shape=(4, 32), dtype="float32"),
                      "token_ids": Sequence(Value(dtype="int32"), length=4)})
    Dataset.from_dict({"blocks.1.hook_resid_post": np.zeros((2, 4, 32), np.float32),
                       "token_ids": np.zeros((2, 4), np.int32)}, features=feats).save_to_disk(str(tmp_path / "narrow"))
    argv[2] = tmp_path / "narrow"
    rc, _, err = cli(argv, capsys)
    assert rc == 2 and "a cache of another model" in one_error_line(err) and nothing_at(tmp_path / "r")
    feats = Features({"blocks.7.hook_resid_post": Array2D(shape=(4, 64), dtype="float32"),
                      "token_ids": Sequence(Value(dtype="int32"), length=4)})
    Dataset.from_dict({"blocks.7.hook_resid_post": np.zeros((2, 4, 64), np.float32),
                       "token_ids": np.zeros((2, 4), np.int32)}, features=feats).save_to_disk(str(tmp_path / "deep"))
    argv[2] = tmp_path / "deep"
    rc, _, err = cli(argv, capsys)  # tiny-llama has 4 layers
    assert rc == 2 and "for a model of 4 layers" in one_error_line(err) and nothing_at(tmp_path / "r")
