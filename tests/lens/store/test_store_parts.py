"""One capture split into parts (``--part i/N``) and merged (``lens store merge``) equals a single capture.

Parts are captured in process with the session's tiny models; the merges and the refusals go through
the real command line (``app.commands.cli.main``): exit 2 with one ``lens: error:`` line, nothing left behind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import lens
from lens.store.format import commit_manifest
from lens.store.parts import parse_part, part_windows
from tests.lens.store_harness import capture_argv, run_cli, store_files

# eleven shards of two 32-token windows (a spread sample of 600 tokens of lee), a per-layer site and a
# single-position site (as the fault tests)
KW = dict(corpus="lee", max_tokens=600, seq_len=32, batch_size=2, shard_tokens=64, sites=["resid_post", "embed"],
          progress=False)


def _cli(argv, capsys) -> tuple[int, str]:
    from app.commands.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def _one_error_line(err: str) -> str:
    lines = [l for l in err.splitlines() if l.strip() and "%|" not in l]
    assert len(lines) == 1 and lines[0].startswith("lens: error:") and "Traceback" not in err, err
    return lines[0]


def assert_equal_to_single(merged: Path, single: Path) -> None:
    """Every shard file byte for byte; the manifest equal but for creation time, seal and provenance."""
    a, b = store_files(merged), store_files(single)
    assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
    for name in a:
        if name != "manifest.json":
            assert a[name] == b[name], name
    ma, mb = json.loads(a["manifest.json"]), json.loads(b["manifest.json"])
    assert len(ma.pop("merged_from")) >= 1
    parts = ma["fidelity"].pop("parts")  # every part's record (lens.store.fidelity.merged_record); all ok: part 1's
    assert len(parts) >= 1 and ma["fidelity"].pop("part") == parts[0]["part"] == f"1/{len(parts)}"
    mb["fidelity"].pop("parts"), mb["fidelity"].pop("part")
    for m in (ma, mb):
        m.pop("created"), m.pop("manifest_sha256")
    assert ma == mb


@pytest.fixture(scope="module")
def stores(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("parts")
    lens.capture(tiny_llama, out=root / "single", **KW)
    for i in (1, 2, 3):
        lens.capture(tiny_llama, out=root / f"p{i}", part=f"{i}/3", **KW)
    return root


def test_three_parts_merged_equal_one_capture(stores, tmp_path, capsys):
    parts = [json.loads((stores / f"p{i}" / "manifest.json").read_text()) for i in (1, 2, 3)]
    assert [p["part"]["index"] for p in parts] == [1, 2, 3]
    assert parts[0]["part"]["window_start"] == 0 and parts[2]["part"]["window_end"] == parts[0]["part"]["n_windows_total"]
    assert all(p["complete"] and len(p["shards"]) >= 3 for p in parts)
    # a part is a store of its own: readable, with the whole plan's window ids
    p2 = lens.open_store(stores / "p2")
    assert p2.tokens["window"][0] == parts[1]["part"]["window_start"] and p2.get(layer=1).shape[0] == p2.n_tokens
    rc, err = _cli(["store", "merge", stores / "p3", stores / "p1", stores / "p2", "--out", tmp_path / "m",
                    "--quiet"], capsys)
    assert rc == 0, err
    assert_equal_to_single(tmp_path / "m", stores / "single")
    assert _cli(["store", "verify", tmp_path / "m"], capsys)[0] == 0
    single, merged = lens.open_store(stores / "single"), lens.open_store(tmp_path / "m")
    assert merged.complete and merged.manifest["fingerprint"] == single.manifest["fingerprint"]
    assert np.array_equal(merged.get(layer=2).numpy(), single.get(layer=2).numpy())
    assert not (tmp_path / "m" / "writer.lock").exists()


def test_partition_is_disjoint_whole_shards_and_checked():
    for n_windows, per, count in [(20, 2, 3), (21, 4, 6), (7, 8, 1), (100, 5, 20)]:
        spans = [part_windows(parse_part(f"{i}/{count}"), n_windows, per) for i in range(1, count + 1)]
        assert spans[0][0] == 0 and spans[-1][1] == n_windows
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert all(lo % per == 0 and hi > lo for lo, hi in spans)
    for bad in ("0/3", "4/3", "3", "a/b", "1/0"):
        with pytest.raises(lens.LensInputError, match="--part"):
            parse_part(bad)
    with pytest.raises(lens.LensInputError, match="only 3 shards"):
        part_windows(parse_part("4/4"), 5, 2)


@pytest.mark.parametrize("argv_tail,expect", [
    (["--part", "0/3"], "expected 1 <= i <= N"),
    (["--part", "two/3"], "--part expects i/N"),
    (["--part", "12/12"], "cuts into only 11 shards"),
])
def test_bad_part_is_refused(argv_tail, expect, tiny_llama, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(lens, "load_model", lambda *a, **k: tiny_llama)
    rc, err = _cli(capture_argv(tmp_path / "s") + argv_tail, capsys)
    assert rc == 2 and expect in _one_error_line(err)
    assert not (tmp_path / "s").exists()


def _incomplete(src: Path, dst: Path) -> Path:
    """A copy of a part as an interrupted capture leaves it: its last shard not yet committed."""
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    last = m["shards"].pop()
    shutil.rmtree(dst / "shards" / last["name"])
    m["n_tokens"] -= last["n_tokens"]
    m["nonfinite"] = {s: [a - b for a, b in zip(c, last["nonfinite"][s])] for s, c in m["nonfinite"].items()}
    m["complete"] = False
    commit_manifest(dst, m)
    return dst


@pytest.fixture(scope="module")
def odd_stores(tiny_llama, tiny_gpt2, stores):
    """Parts that do not belong with stores/p1..p3."""
    lens.capture(tiny_gpt2, out=stores / "gpt2-p2", part="2/3", **KW)
    lens.capture(tiny_llama, out=stores / "sites-p2", part="2/3", **{**KW, "sites": ["resid_post"]})
    lens.capture(tiny_llama, out=stores / "half-p2", part="2/2", **KW)
    _incomplete(stores / "p3", stores / "p3-incomplete")
    return stores


@pytest.mark.parametrize("parts,expect", [
    (["p1", "gpt2-p2", "p3"], "captured from different models (tiny-llama and tiny-gpt2)"),
    (["p1", "sites-p2", "p3"], "captured with different settings (sites:"),
    (["p1", "p2", "p2", "p3"], "part 2/3 is given twice"),
    (["p1", "p3"], "part 2/3 is missing (given: 1/3, 3/3)"),
    (["p1", "p2", "p3-incomplete"], "part 3/3 is incomplete"),
    (["p1", "half-p2", "p3"], "parts of different splits"),
    (["single", "p2"], "not a part of a split capture"),
])
def test_merge_refuses_parts_that_do_not_belong_together(parts, expect, odd_stores, tmp_path, capsys):
    rc, err = _cli(["store", "merge", *[odd_stores / p for p in parts], "--out", tmp_path / "m"], capsys)
    assert rc == 2, err
    assert expect in _one_error_line(err)
    assert not (tmp_path / "m").exists()


def test_merge_of_a_damaged_part_is_refused_and_leaves_nothing(stores, tmp_path, capsys):
    for i in (1, 2, 3):
        shutil.copytree(stores / f"p{i}", tmp_path / f"p{i}")
    m = json.loads((tmp_path / "p2" / "manifest.json").read_text())
    victim = tmp_path / "p2" / "shards" / m["shards"][-1]["name"] / "resid_post.npy"
    raw = bytearray(victim.read_bytes())
    raw[-5] ^= 0x40
    victim.write_bytes(bytes(raw))
    rc, err = _cli(["store", "merge", *[tmp_path / f"p{i}" for i in (1, 2, 3)], "--out", tmp_path / "m", "--quiet"],
                   capsys)
    assert rc == 2 and "fails its checksum" in _one_error_line(err) and str(victim) in err
    assert not (tmp_path / "m").exists()
    rc, err = _cli(["store", "merge", tmp_path / "p1", "--out", tmp_path / "p1"], capsys)
    assert rc == 2 and "part" in _one_error_line(err)


def test_a_killed_part_resumes_exactly_and_is_not_resumed_as_another(stores, tiny_llama, tiny_gpt2, tmp_path):
    models = {"tiny-llama": tiny_llama, "tiny-gpt2": tiny_gpt2}
    argv = capture_argv(tmp_path / "p2") + ["--part", "2/3"]
    assert run_cli(argv, models, env={"LENS_STORE_FAULT": "shard.renamed@2"}).killed
    other = run_cli(capture_argv(tmp_path / "p2", resume=True) + ["--part", "1/3"], models)
    assert other.rc == 2 and "part: store has '2/3', this run has '1/3'" in other.error_line()
    done = run_cli(argv + ["--resume"], models)
    assert done.rc == 0, done.stderr
    got, want = store_files(tmp_path / "p2"), store_files(stores / "p2")
    assert sorted(got) == sorted(want)
    assert all(got[k] == want[k] for k in got if k != "manifest.json")
