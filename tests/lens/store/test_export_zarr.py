"""``Store.to_dask`` / ``Store.to_xarray`` (lazy, one chunk per layer and shard) and the zarr v3 export, read by
xarray and dask themselves: a per-layer mean computed by xarray/dask equals ``store.stats``; the zarr arrays equal
the store (bfloat16 widened exactly), carry the token table as coordinates and the manifest as attributes, and are
sealed with crc32c."""

from __future__ import annotations

import json

import numpy as np
import pytest

import lens
from lens.capturing.exchange import export_store
from tests.lens.store.exchange_helpers import cli, make_store, nothing_at, one_error_line


@pytest.fixture(scope="module")
def bf16_store(tiny_llama, tmp_path_factory):
    return make_store(tiny_llama, tmp_path_factory.mktemp("zarr") / "s", "bfloat16")


def test_xarray_and_dask_compute_the_stored_statistics(bf16_store):
    store = lens.open_store(bf16_store)
    x = store.to_xarray("resid_post")
    assert x.dims == ("layer", "token", "d_model") and list(x["layer"].values) == [0, 1, 2]
    assert x.data.numblocks == (3, len(store.manifest["shards"]), 1)  # one chunk per layer and shard: lazy
    assert np.array_equal(x["token_text"].values, store.tokens["token"])
    stats = store.stats("resid_post", drop_special=False)
    mean = x.astype("float64").mean("token").values
    np.testing.assert_allclose(mean, stats.mean, rtol=1e-9, atol=1e-12)
    # dask alone: the text tokens only (store.stats' default mask), per layer
    keep = store.mask(drop_special=True)
    d = store.to_dask("resid_post")[:, keep].astype("float64").mean(axis=1).compute()
    np.testing.assert_allclose(d, store.stats("resid_post").mean, rtol=1e-9, atol=1e-12)
    assert np.array_equal(store.to_dask("embed").compute(), store.get("embed").float().numpy())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_store_held_in_memory_gives_the_same_arrays(tiny_llama, bf16_store, dtype):
    """``lens.capture`` without ``out`` (a notebook's store): the same dask / xarray forms, one chunk per layer
    copied to host memory when computed, equal to the store's values and the same as the store on disk's."""
    from tests.lens.store.exchange_helpers import KW

    mem = lens.capture(tiny_llama, dtype=dtype, **KW)
    assert mem.root is None
    x = mem.to_xarray("resid_post")
    assert x.dims == ("layer", "token", "d_model") and x.data.numblocks == (3, 1, 1) and x.attrs["store"] == "in memory"
    for layer in (0, 2):
        assert np.array_equal(x.sel(layer=layer).values, mem.get("resid_post", layer).float().numpy())
    assert np.array_equal(mem.to_dask("embed").compute(), mem.get("embed").float().numpy())
    assert np.array_equal(x["token_id"].values, mem.tokens["token_id"])
    if dtype == "bfloat16":  # the same capture on disk reads the same
        assert np.array_equal(x.values, lens.open_store(bf16_store).to_xarray("resid_post").values)


def test_zarr_export_reads_back_in_xarray_and_dask(bf16_store, tmp_path, capsys):
    import dask.array as da
    import xarray as xr

    store = lens.open_store(bf16_store)
    rc, out_text, err = cli(["store", "export", bf16_store, "--to", "zarr", "--out", tmp_path / "z", "--quiet"], capsys)
    assert rc in (0, None), err
    ds = xr.open_zarr(tmp_path / "z", consolidated=False)
    assert ds["resid_post"].dtype == np.float32 and ds["resid_post"].attrs["stored_dtype"] == "bfloat16"
    assert list(ds["resid_post_layer"].values) == [0, 1, 2]
    for j, layer in enumerate([0, 1, 2]):
        assert np.array_equal(ds["resid_post"][j].values, store.get("resid_post", layer).float().numpy())
    assert np.array_equal(ds["token_id"].values, store.tokens["token_id"])
    assert list(ds["token_text"].values) == list(store.tokens["token"])
    assert "token_text" in ds["resid_post"].coords  # the token table as coordinates
    assert ds.attrs["lens_manifest"]["model"]["model_id"] == "tiny-llama"
    assert ds.attrs["lens_source"]["manifest_sha256"] == store.manifest["manifest_sha256"]
    a = da.from_zarr(str(tmp_path / "z"), component="resid_post")
    np.testing.assert_allclose(a.astype("f8").mean(axis=1).compute(), store.stats("resid_post", drop_special=False).mean,
                               rtol=1e-9, atol=1e-12)
    meta = json.loads((tmp_path / "z" / "resid_post" / "zarr.json").read_text())
    sharding = meta["codecs"][0]
    assert sharding["name"] == "sharding_indexed"
    assert [c["name"] for c in sharding["configuration"]["codecs"]][-1] == "crc32c"
    # an --out that exists is refused; so is a store that is not there
    rc, _, err = cli(["store", "export", bf16_store, "--to", "zarr", "--out", tmp_path / "z"], capsys)
    assert rc == 2 and "already exists" in one_error_line(err)
    rc, _, err = cli(["store", "export", tmp_path / "nope", "--to", "zarr", "--out", tmp_path / "z2"], capsys)
    assert rc == 2 and nothing_at(tmp_path / "z2")


def test_tensorstore_reads_the_zarr_export(bf16_store, tmp_path):
    ts = pytest.importorskip("tensorstore")
    store = lens.open_store(bf16_store)
    out = export_store(bf16_store, "zarr", tmp_path / "z", layers="1,2")
    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(out / "resid_post")}}, open=True).result()
    assert tuple(arr.shape) == (2, store.n_tokens, store.d_model)
    assert list(arr.domain.labels) == ["resid_post_layer", "token", "d_model"]
    assert np.array_equal(arr[1, :100].read().result(), store.get("resid_post", 2)[:100].float().numpy())


def test_a_store_held_in_memory_is_not_exported_but_says_how(tiny_llama, tmp_path):
    from tests.lens.store.exchange_helpers import KW

    mem = lens.capture(tiny_llama, **KW)
    for fmt in ("safetensors", "saelens", "zarr"):
        with pytest.raises(lens.LensInputError, match=r"held in memory \(capture it with out=DIR"):
            export_store(mem, fmt, tmp_path / fmt)
        assert nothing_at(tmp_path / fmt)
