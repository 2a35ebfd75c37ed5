"""The activation store: round trip, dtypes, devices, corruption. Crash-safe resume (kill -9 at every commit step
and at random moments) is tests/lens/store/test_store_faults.py."""

import json

import numpy as np
import pytest
import torch

import lens
from lens.errors import LensInputError, StoreCorruptError



def test_disk_store_round_trips_the_in_memory_capture(tiny_llama, tmp_path):
    kw = dict(corpus="lee", sites=["resid_post", "attn_out", "embed"], layers="0,2", max_tokens=700,
              seq_len=64, batch_size=4, progress=False)
    mem = lens.capture(tiny_llama, **kw)
    disk = lens.capture(tiny_llama, out=tmp_path / "s", shard_tokens=128, **kw)
    assert len(disk.manifest["shards"]) > 2  # several shards were written
    reopened = lens.open_store(tmp_path / "s")
    for store in (disk, reopened, lens.open_store(tmp_path / "s", device="cpu")):
        assert store.n_tokens == mem.n_tokens == 700
        assert store.layers("resid_post") == [0, 2]
        for site, layer in [("resid_post", 0), ("resid_post", 2), ("attn_out", 2), ("embed", None)]:
            assert torch.equal(store.get(site, layer), mem.get(site, layer))
        for col in ("doc", "window", "pos", "token_id", "next_token_id", "special", "token"):
            assert np.array_equal(store.tokens[col], mem.tokens[col])
    with pytest.raises(LensInputError, match="layer 1 of resid_post is not in this store"):
        reopened.get("resid_post", 1)
    with pytest.raises(LensInputError, match="site 'mlp_out' is not in this store"):
        reopened.get("mlp_out", 0)


def test_store_is_readable_with_numpy_alone(tiny_llama, tmp_path):
    store = lens.capture(tiny_llama, corpus="lee", max_tokens=300, out=tmp_path / "s", progress=False)
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    parts = [np.load(tmp_path / "s" / "shards" / s["name"] / "resid_post.npy", allow_pickle=False)
             for s in manifest["shards"]]
    layer3 = np.concatenate([p[manifest["sites"]["resid_post"].index(3)] for p in parts])
    assert np.array_equal(layer3, store.get(layer=3).numpy())


@pytest.mark.parametrize("dtype,tol", [("float16", 1e-3), ("bfloat16", 1e-2)])
def test_half_precision_stores(tiny_llama, tmp_path, dtype, tol):
    ref = lens.capture(tiny_llama, corpus="lee", max_tokens=200, progress=False)
    store = lens.capture(tiny_llama, corpus="lee", max_tokens=200, progress=False, dtype=dtype, out=tmp_path / dtype)
    got = lens.open_store(tmp_path / dtype).get(layer=1)
    assert got.dtype == getattr(torch, dtype)
    torch.testing.assert_close(got.float(), ref.get(layer=1), atol=tol, rtol=tol)
    assert store.manifest["storage_dtype"].startswith(dtype)


def test_corrupt_shard_is_named(tiny_llama, tmp_path):
    lens.capture(tiny_llama, corpus="lee", max_tokens=600, seq_len=64, batch_size=2, out=tmp_path / "s",
                 shard_tokens=128, progress=False)
    target = tmp_path / "s" / "shards" / "00001" / "resid_post.npy"
    data = bytearray(target.read_bytes())
    data[-5] ^= 0xFF
    target.write_bytes(bytes(data))
    store = lens.open_store(tmp_path / "s")
    store.get(layer=0)  # layer 0 is intact: only the bytes read are verified
    with pytest.raises(StoreCorruptError, match="shards/00001/resid_post.npy: layer block 3 fails its checksum"):
        store.get(layer=3)
    with pytest.raises(StoreCorruptError, match="00001"):
        store.verify()
    target.write_bytes(bytes(data[:-10]))  # truncated
    with pytest.raises(StoreCorruptError, match="00001/resid_post.npy: has .* bytes"):
        lens.open_store(tmp_path / "s").get(layer=0)


def test_no_overwrite_and_wrong_resume(tiny_llama, tmp_path):
    lens.capture(tiny_llama, corpus="lee", max_tokens=200, out=tmp_path / "s", progress=False)
    before = (tmp_path / "s" / "manifest.json").read_bytes()
    with pytest.raises(LensInputError, match="already exists"):
        lens.capture(tiny_llama, corpus="lee", max_tokens=200, out=tmp_path / "s", progress=False)
    with pytest.raises(LensInputError, match="other settings.*max_tokens"):
        lens.capture(tiny_llama, corpus="lee", max_tokens=300, out=tmp_path / "s", progress=False, resume=True)
    with pytest.raises(LensInputError, match="other settings.*model_id"):
        lens.capture(lens.load_model("tiny-gpt2"), corpus="lee", max_tokens=200, out=tmp_path / "s",
                     progress=False, resume=True)
    assert (tmp_path / "s" / "manifest.json").read_bytes() == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "precious.txt").write_text("keep me")
    with pytest.raises(LensInputError, match="not a store"):
        lens.capture(tiny_llama, corpus="lee", max_tokens=200, out=tmp_path / "other", progress=False)
    assert (tmp_path / "other" / "precious.txt").read_text() == "keep me"


def test_open_store_errors(tmp_path):
    with pytest.raises(LensInputError, match="not found"):
        lens.open_store(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LensInputError, match="not an activation store"):
        lens.open_store(tmp_path / "empty")




def test_count_nonfinite_is_exact():
    from lens.store.format import count_nonfinite

    x = torch.randn(300, 7)
    assert count_nonfinite(x) == 0
    assert count_nonfinite(torch.arange(5)) == 0  # integers are always finite
    y = x.clone()
    y[3, 2], y[100, 0], y[299, 6] = float("nan"), float("inf"), -float("inf")
    assert count_nonfinite(y) == 3
    big = torch.full((10,), 3e38)  # finite entries whose float32 sum overflows: counted, not guessed
    assert count_nonfinite(big) == 0
    big[4] = float("nan")
    assert count_nonfinite(big) == 1
    assert count_nonfinite(torch.tensor([float("inf"), -float("inf")])) == 2  # inf - inf = nan: still caught
