"""The activation store: round trip, dtypes, devices, corruption, and crash-safe resume."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import lens
from lens.errors import LensInputError, StoreCorruptError

ROOT = Path(__file__).resolve().parents[2]


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
            assert torch.equal(store.get(layer, site), mem.get(layer, site))
        for col in ("doc", "window", "pos", "token_id", "next_token_id", "special", "token"):
            assert np.array_equal(store.tokens[col], mem.tokens[col])
    with pytest.raises(LensInputError, match="layer 1 of resid_post is not in this store"):
        reopened.get(1, "resid_post")
    with pytest.raises(LensInputError, match="site 'mlp_out' is not in this store"):
        reopened.get(0, "mlp_out")


def test_store_is_readable_with_numpy_alone(tiny_llama, tmp_path):
    store = lens.capture(tiny_llama, corpus="lee", max_tokens=300, out=tmp_path / "s", progress=False)
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    parts = [np.load(tmp_path / "s" / "shards" / s["name"] / "resid_post.npy", allow_pickle=False)
             for s in manifest["shards"]]
    layer3 = np.concatenate([p[manifest["sites"]["resid_post"].index(3)] for p in parts])
    assert np.array_equal(layer3, store.get(3).numpy())


@pytest.mark.parametrize("dtype,tol", [("float16", 1e-3), ("bfloat16", 1e-2)])
def test_half_precision_stores(tiny_llama, tmp_path, dtype, tol):
    ref = lens.capture(tiny_llama, corpus="lee", max_tokens=200, progress=False)
    store = lens.capture(tiny_llama, corpus="lee", max_tokens=200, progress=False, dtype=dtype, out=tmp_path / dtype)
    got = lens.open_store(tmp_path / dtype).get(1)
    assert got.dtype == getattr(torch, dtype)
    torch.testing.assert_close(got.float(), ref.get(1), atol=tol, rtol=tol)
    assert store.manifest["storage_dtype"].startswith(dtype)


def test_corrupt_shard_is_named(tiny_llama, tmp_path):
    lens.capture(tiny_llama, corpus="lee", max_tokens=600, seq_len=64, batch_size=2, out=tmp_path / "s",
                 shard_tokens=128, progress=False)
    target = tmp_path / "s" / "shards" / "00001" / "resid_post.npy"
    data = bytearray(target.read_bytes())
    data[-5] ^= 0xFF
    target.write_bytes(bytes(data))
    store = lens.open_store(tmp_path / "s")
    store.get(0)  # layer 0 is intact: only the bytes read are verified
    with pytest.raises(StoreCorruptError, match="shards/00001/resid_post.npy: layer block 3 fails its checksum"):
        store.get(3)
    with pytest.raises(StoreCorruptError, match="00001"):
        store.verify()
    target.write_bytes(bytes(data[:-10]))  # truncated
    with pytest.raises(StoreCorruptError, match="00001/resid_post.npy: has .* bytes"):
        lens.open_store(tmp_path / "s").get(0)


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


CAPTURE = [sys.executable, "-m", "app", "capture", "tiny-llama", "--corpus", "lee", "--max-tokens", "1500",
           "--seq-len", "32", "--batch-size", "2", "--shard-tokens", "64", "--sites", "resid_post,mlp_out",
           "--quiet"]


def _run_and_kill(out: Path, n_complete: int, mid_shard: bool) -> None:
    env = {**os.environ, "LENS_DEBUG_BATCH_DELAY": "0.05", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(CAPTURE + ["--out", str(out)] + (["--resume"] if (out / "manifest.json").exists() else []),
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            manifest = out / "manifest.json"
            if manifest.exists():
                try:
                    done = len(json.loads(manifest.read_text())["shards"])
                except (json.JSONDecodeError, KeyError):
                    done = -1
                partial = list((out / "shards").glob("*.partial")) if (out / "shards").exists() else []
                if done >= n_complete and (not mid_shard or partial):
                    break
            if proc.poll() is not None:
                break
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    ref_dir = tmp_path / "ref"
    subprocess.run(CAPTURE + ["--out", str(ref_dir)], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL)
    ref = lens.open_store(ref_dir)
    out = tmp_path / "killed"
    # kill points: during the first shard, right after shard 2 is committed, in the middle of a later shard
    for n_complete, mid in [(0, True), (2, False), (5, True)]:
        _run_and_kill(out, n_complete, mid)
        partial = lens.open_store(out)  # a reader sees only complete shards
        assert partial.n_tokens == sum(s["n_tokens"] for s in partial.manifest["shards"])
    subprocess.run(CAPTURE + ["--out", str(out), "--resume"], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL)
    got = lens.open_store(out)
    assert got.complete and got.n_tokens == ref.n_tokens == 1500
    assert not list((out / "shards").glob("*.partial"))
    for col in ref.tokens:
        assert np.array_equal(got.tokens[col], ref.tokens[col]), col
    for site in ("resid_post", "mlp_out"):
        for layer in ref.layers(site):
            assert torch.equal(got.get(layer, site), ref.get(layer, site))
    windows = np.concatenate([[s["window_start"], s["window_end"]] for s in got.manifest["shards"]])
    assert np.all(windows[1:-1:2] == windows[2::2])  # consecutive shards: no gap, no duplicate
