"""Store -> safetensors -> store: every value, the token table and the shard files come back exactly for float32,
float16 and bfloat16 (kept as BF16); the files read with ``safe_open`` in a process that never imports the
project; bad input (unknown format, truncated header, a full disk, a layer-shifted export) is one line, exit 2,
and nothing left that reads as complete."""

from __future__ import annotations

import errno
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import lens
from lens.capturing.exchange import export_store, import_store
from lens.errors import LensInputError, SilentlyWrong, StoreWriteError
from tests.lens.store.exchange_helpers import cli, make_store, nothing_at, one_error_line


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.fixture(scope="module")
def stores(tiny_llama, tmp_path_factory):
    """dtype -> a store of tiny-llama's resid_post 0..3 and embed (captured once per module)."""
    made = {}

    def get(dtype):
        if dtype not in made:
            made[dtype] = make_store(tiny_llama, tmp_path_factory.mktemp(dtype) / "s", dtype, layers="0,1,2,3")
        return made[dtype]
    return get


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_round_trip_is_exact(tiny_llama, tmp_path, dtype, stores):
    src = stores(dtype)
    if dtype == "float16":  # a file per site-layer of each shard, as a shard past the file size is cut
        from lens.store.exchange.safetensors_io import export_safetensors

        out = export_safetensors(lens.open_store(src), tmp_path / "e", file_bytes=1)
        assert len(list(out.glob("*.safetensors"))) == 5 * len(lens.open_store(src).manifest["shards"])
    else:
        out = export_store(src, "safetensors", tmp_path / "e")
    back = import_store(out, "safetensors", tmp_path / "r", model=tiny_llama)
    a, b = lens.open_store(src), lens.open_store(back)
    for site, layer in [("resid_post", 0), ("resid_post", 1), ("resid_post", 3), ("embed", None)]:
        assert torch.equal(_bits(a.get(site, layer)), _bits(b.get(site, layer))), (site, layer)
    for col in a.tokens:
        assert np.array_equal(a.tokens[col], b.tokens[col]), col
    assert [s["files"] for s in a.manifest["shards"]] == [s["files"] for s in b.manifest["shards"]]
    assert b.manifest["fidelity"]["verdict"] == "ok"  # checked against tiny-llama's forward
    assert b.manifest["imported"]["from"] == "safetensors"
    assert b.manifest["imported"]["source_manifest_sha256"] == a.manifest["manifest_sha256"]
    from safetensors import safe_open

    with safe_open(str(out / "00000.safetensors"), "pt") as fh:
        assert fh.get_tensor("resid_post.0").dtype == getattr(torch, dtype)  # bfloat16 as BF16, not uint16
        meta = fh.metadata()
    assert json.loads(meta["source"])["manifest_sha256"] == a.manifest["manifest_sha256"]


def test_safe_open_alone_reads_the_export(tmp_path, stores):
    src = stores("bfloat16")
    out = export_store(src, "safetensors", tmp_path / "e", sites="resid_post", layers="2")
    code = ("import json, sys, glob\nfrom safetensors import safe_open\n"
            "rows = 0\n"
            "for p in sorted(glob.glob(sys.argv[1] + '/*.safetensors')):\n"
            "    with safe_open(p, 'pt') as f:\n"
            "        x = f.get_tensor('resid_post.2'); rows += x.shape[0]\n"
            "        assert str(x.dtype) == 'torch.bfloat16' and sorted(json.loads(f.metadata()['source'])['sites']) == ['resid_post']\n"
            "assert not [m for m in sys.modules if m == 'lens' or m.startswith(('lens.', 'app.', 'studies.'))]\n"
            "print(rows)\n")
    done = subprocess.run([sys.executable, "-I", "-c", code, str(out)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    store = lens.open_store(src)
    assert int(done.stdout) == store.n_tokens
    with pytest.raises(LensInputError, match="layer 3 of attn_out is not in this store|site 'attn_out' is not in this store"):
        export_store(src, "safetensors", tmp_path / "e2", sites="attn_out", layers="3")


def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch, stores):
    src = stores("float32")
    rc, _, err = cli(["store", "export", src, "--to", "parquet", "--out", tmp_path / "x"], capsys)
    assert rc == 2 and "unknown export format 'parquet'" in one_error_line(err) and nothing_at(tmp_path / "x")
    rc, _, err = cli(["store", "import", src, "--from", "hdf5", "--out", tmp_path / "x"], capsys)
    assert rc == 2 and "unknown import format 'hdf5'" in one_error_line(err)
    # the free space is checked first: nothing written
    monkeypatch.setenv("LENS_FREE_SPACE_BYTES", "1000")
    rc, _, err = cli(["store", "export", src, "--to", "safetensors", "--out", tmp_path / "e", "--quiet"], capsys)
    assert rc == 2 and "free" in one_error_line(err) and nothing_at(tmp_path / "e")
    monkeypatch.delenv("LENS_FREE_SPACE_BYTES")
    # the disk fills while the second file is written: nothing kept, no staging folder left
    import safetensors.torch

    real, calls = safetensors.torch.save_file, []

    def full_disk(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == 2:
            with open(path, "wb") as fh:
                fh.write(b"\0" * 100)
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(tensors, path, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    rc, _, err = cli(["store", "export", src, "--to", "safetensors", "--out", tmp_path / "e", "--quiet"], capsys)
    assert rc == 2 and "No space left on device" in one_error_line(err) and nothing_at(tmp_path / "e")
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    # a truncated header
    out = export_store(src, "safetensors", tmp_path / "e")
    first = out / "00000.safetensors"
    first.write_bytes(first.read_bytes()[:100])
    rc, _, err = cli(["store", "import", out, "--from", "safetensors", "--out", tmp_path / "r"], capsys)
    assert rc == 2 and "not a readable safetensors file" in one_error_line(err) and nothing_at(tmp_path / "r")
    # an --out that exists is never overwritten
    rc, _, err = cli(["store", "export", src, "--to", "safetensors", "--out", out, "--quiet"], capsys)
    assert rc == 2 and "already exists" in one_error_line(err)


def test_a_layer_shifted_export_is_refused(tiny_llama, tmp_path, capsys, stores):
    """resid_post.l holding layer l+1's states: the fidelity check against tiny-llama's forward refuses it."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = stores("float32")
    out = export_store(src, "safetensors", tmp_path / "e", layers="0,1,2")
    nxt = export_store(src, "safetensors", tmp_path / "n", layers="1,2,3")
    for f in sorted(out.glob("*.safetensors")):
        with safe_open(str(f), "pt") as a, safe_open(str(nxt / f.name), "pt") as b:
            tensors = {k: a.get_tensor(k) for k in a.keys()}
            meta = a.metadata()
            for l in (0, 1, 2):
                tensors[f"resid_post.{l}"] = b.get_tensor(f"resid_post.{l + 1}")
        save_file(tensors, str(f), metadata=meta)
    with pytest.raises(SilentlyWrong, match="resid_post at layer 0 differs from Hugging Face"):
        import_store(out, "safetensors", tmp_path / "r", model=tiny_llama)
    assert nothing_at(tmp_path / "r")
    rc, _, err = cli(["store", "import", out, "--from", "safetensors", "--model", "tiny-llama", "--out",
                      tmp_path / "r", "--quiet"], capsys)
    assert rc == 2 and "do not match tiny-llama" in one_error_line(err) and nothing_at(tmp_path / "r")
    # without the model it is imported, and says so; likewise when the model named does not load
    back = import_store(out, "safetensors", tmp_path / "r")
    assert lens.open_store(back).manifest["fidelity"]["verdict"] == "not-checked"
    assert "not verified" in lens.open_store(back).manifest["fidelity"]["why_not"]
    back = import_store(out, "safetensors", tmp_path / "r2", model=tmp_path / "no-such-model")
    assert "could not be loaded" in lens.open_store(back).manifest["fidelity"]["why_not"]
    assert isinstance(StoreWriteError("x"), LensInputError)


def test_a_study_on_the_imported_store_gives_the_same_metrics(tmp_path, capsys):
    """store -> safetensors -> store, then the same study on both: result.json's metrics and summary equal."""
    common = ["--model", "tiny-llama", "--corpus", "lee", "--max-tokens", "300", "--seq-len", "64", "--quiet"]
    rc, _, err = cli(["study", "anisotropy", "--store", tmp_path / "s", "--out", tmp_path / "r1", *common], capsys)
    assert rc in (0, None), err
    export_store(tmp_path / "s", "safetensors", tmp_path / "e")
    import_store(tmp_path / "e", "safetensors", tmp_path / "s2", model="tiny-llama")
    rc, _, err = cli(["study", "anisotropy", "--store", tmp_path / "s2", "--out", tmp_path / "r2", *common], capsys)
    assert rc in (0, None), err
    a, b = (json.loads((tmp_path / r / "result.json").read_text()) for r in ("r1", "r2"))
    assert a["metrics"] == b["metrics"] and a["summary"] == b["summary"]
