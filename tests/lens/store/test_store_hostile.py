"""Hostile store folders (issue 21): planted links, merges into a part, NaN hidden under a re-sealed manifest.

Every run is the real ``lens`` command line: a forked child (``store_harness``) for captures and
resumes, ``app.commands.cli.main`` in process for ``store`` commands. Each hostile folder ends in exit 2 with
one ``lens: error:`` line naming the path (or site and layer) — never exit 1, never a file outside
the store written, never a NaN handed to a study.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

import lens
from lens.errors import StoreCorruptError
from lens.store.format import manifest_digest
from tests.lens.store_harness import capture_argv, run_cli, store_files

VICTIM = b"precious bytes that no store may overwrite\n"


@pytest.fixture(scope="module")
def models(tiny_llama, tiny_gpt2):
    return {"tiny-llama": tiny_llama, "tiny-gpt2": tiny_gpt2}


@pytest.fixture(scope="module")
def interrupted(models, tmp_path_factory):
    """A capture killed after its second shard was renamed into place (two shards committed)."""
    out = tmp_path_factory.mktemp("interrupted") / "store"
    assert run_cli(capture_argv(out), models, env={"LENS_STORE_FAULT": "shard.renamed@3"}).killed
    assert len(json.loads((out / "manifest.json").read_text())["shards"]) == 2
    return out


def _copy(src: Path, tmp: Path) -> tuple[Path, Path]:
    out = tmp / "store"
    shutil.copytree(src, out, symlinks=True)
    (out / "writer.lock").unlink()  # the killed capture's stale lock: each case plants its own
    victim = tmp / "victim.txt"
    victim.write_bytes(VICTIM)
    return out, victim


def _one_line(outcome) -> str:
    assert outcome.rc == 2, outcome.stderr
    return outcome.error_line()


# ------------------------------------------------------------------------------------ planted links
def _lock_symlink(out, victim):
    (out / "writer.lock").symlink_to(victim)


def _lock_dangling(out, victim):
    (out / "writer.lock").symlink_to(victim.with_name("not-there"))


def _lock_hardlink(out, victim):
    os.link(victim, out / "writer.lock")


def _lock_fifo(out, victim):
    os.mkfifo(out / "writer.lock")


def _shards_link(out, victim):
    outside = victim.with_name("outside-shards")
    (out / "shards").rename(outside)
    (out / "shards").symlink_to(outside)


REFUSED = {  # case -> (plant, the path the one line names)
    "lock-symlink": (_lock_symlink, "writer.lock is a symbolic link"),
    "lock-dangling-symlink": (_lock_dangling, "writer.lock is a symbolic link"),
    "lock-hard-link": (_lock_hardlink, "writer.lock is a file with 2 names"),
    "lock-fifo": (_lock_fifo, "writer.lock is a FIFO"),
    "shards-folder-link": (_shards_link, "shards is a symbolic link"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_planted_link_is_refused_and_its_target_untouched(case, interrupted, models, tmp_path):
    out, victim = _copy(interrupted, tmp_path)
    plant, named = REFUSED[case]
    plant(out, victim)
    outside_before = store_files(victim.with_name("outside-shards")) if case == "shards-folder-link" else None
    line = _one_line(run_cli(capture_argv(out, resume=True), models))
    assert named in line and "untouched" in line, line
    assert victim.read_bytes() == VICTIM
    assert not victim.with_name("not-there").exists()
    if outside_before is not None:
        assert store_files(victim.with_name("outside-shards")) == outside_before
    # the planted thing is left where it was; once it is removed, the capture resumes
    assert os.path.lexists(out / ("shards" if case == "shards-folder-link" else "writer.lock"))
    if case != "shards-folder-link":
        (out / "writer.lock").unlink()
        done = run_cli(capture_argv(out, resume=True), models)
        assert done.rc == 0, done.stderr
        assert victim.read_bytes() == VICTIM and not (out / "writer.lock").exists()


def test_planted_temporary_and_partial_links_are_removed_not_followed(interrupted, models, tmp_path):
    """``manifest.json.tmp`` and a ``*.partial`` shard are the writer's own leftovers: a link in their
    place is removed (never written through, never recursed into) and the capture goes on."""
    out, victim = _copy(interrupted, tmp_path)
    target_dir = tmp_path / "target-dir"
    target_dir.mkdir()
    (target_dir / "keep.txt").write_bytes(VICTIM)
    (out / "manifest.json.tmp").symlink_to(victim)
    (out / "shards" / "00002.partial").symlink_to(target_dir)
    (out / "shards" / "00003").symlink_to(target_dir)  # renamed-but-unlisted slot of a later shard
    done = run_cli(capture_argv(out, resume=True), models)
    assert done.rc == 0, done.stderr
    assert victim.read_bytes() == VICTIM and (target_dir / "keep.txt").read_bytes() == VICTIM
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert run_cli(["store", "verify", out], models).rc == 0


def test_an_out_folder_named_through_a_link_is_the_users_choice(models, tmp_path):
    """Only what lies inside the store folder must not be a link: --out itself may name one."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    done = run_cli(capture_argv(tmp_path / "link"), models)
    assert done.rc == 0, done.stderr
    assert (tmp_path / "real" / "manifest.json").is_file()
    assert run_cli(["store", "verify", tmp_path / "link"], models).rc == 0


# ------------------------------------------------------------------------------------ verify
def test_verify_refuses_a_store_whose_shard_folders_resolve_outside_it(interrupted, models, tmp_path, capsys):
    from app.commands.cli import main

    for what in ("shards", "shards/00001"):
        case = tmp_path / what.replace("/", "-")
        case.mkdir()
        out, _ = _copy(interrupted, case)
        outside = case / "elsewhere"
        (out / what).rename(outside)
        (out / what).symlink_to(outside)
        capsys.readouterr()
        assert main(["store", "verify", str(out), "--json"]) == 2
        report = json.loads(capsys.readouterr().out)
        assert not report["ok"] and len(report["outside"]) == 1 and str(out / what) in report["outside"][0]
        assert any("outside the store" in p for p in report["problems"])
    # a link that stays inside the store is only a warning (readers refuse linked files themselves)
    out, _ = _copy(interrupted, tmp_path / "inside")
    (out / "shards" / "00000" / "extra.npy").symlink_to(out / "shards" / "00000" / "tokens.doc.npy")
    capsys.readouterr()
    assert main(["store", "verify", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["outside"] == [] and any("a link to" in w for w in report["warnings"])


# ------------------------------------------------------------------------------------ merge
@pytest.fixture(scope="module")
def parts(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("parts")
    kw = dict(corpus="lee", max_tokens=256, seq_len=32, batch_size=2, shard_tokens=64, sites=["resid_post"],
              progress=False)
    for i in (1, 2):
        lens.capture(tiny_llama, out=root / f"p{i}", part=f"{i}/2", **kw)
    return root


def test_merge_into_a_part_is_refused_before_anything_is_written(parts, tmp_path, capsys):
    from app.commands.cli import main

    p1, p2 = parts / "p1", parts / "p2"
    (tmp_path / "link-to-p2").symlink_to(p2)
    before = {p: sorted(str(f.relative_to(p)) for f in p.rglob("*")) for p in (p1, p2)}
    for out in (p2 / "merged", p2, p1 / "shards" / "x", tmp_path / "link-to-p2" / "merged", parts):
        capsys.readouterr()
        rc = main(["store", "merge", str(p1), str(p2), "--out", str(out), "--quiet"])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and err.startswith("lens: error: --out"), err
        assert "part" in err
    assert before == {p: sorted(str(f.relative_to(p)) for f in p.rglob("*")) for p in (p1, p2)}
    capsys.readouterr()
    assert main(["store", "merge", str(p1), str(p2), "--out", str(tmp_path / "merged"), "--quiet"]) == 0
    assert lens.open_store(tmp_path / "merged").complete


# ------------------------------------------------------------------------------------ hidden NaN
def reseal_with_nan(root: Path, layer: int, site: str = "resid_post") -> None:
    """Write NaN into one layer block, then recompute its CRC and the manifest's seal (leaving the
    recorded non-finite counts at 0): a store altered by someone who knows the format."""
    m = json.loads((root / "manifest.json").read_text())
    shard = m["shards"][-1]
    idx = m["sites"][site].index(layer)
    path = root / "shards" / shard["name"] / f"{site}.npy"
    a = np.load(path, mmap_mode="r+")
    a[idx, 1, :3] = np.nan
    a[idx, 2, 0] = np.inf
    a.flush()
    del a
    block = np.ascontiguousarray(np.load(path, mmap_mode="r")[idx])
    shard["files"][f"{site}.npy"]["layer_crc32"][idx] = f"{zlib.crc32(block.view(np.uint8)):08x}"
    assert shard["nonfinite"][site][idx] == 0
    m["manifest_sha256"] = manifest_digest(m)
    (root / "manifest.json").write_text(json.dumps(m, indent=1))


def test_nan_under_a_resealed_manifest_is_flagged_and_refused(interrupted, tmp_path, capsys):
    from app.commands.cli import main

    out, _ = _copy(interrupted, tmp_path)
    reseal_with_nan(out, layer=1)
    capsys.readouterr()
    assert main(["store", "info", str(out)]) == 2
    cap = capsys.readouterr()
    assert "NON-FINITE resid_post layers 1: 4 NaN/inf values" in cap.out
    assert "resid_post layer 1: the data holds 4 non-finite values (NaN or inf), the manifest records 0" in cap.err
    assert cap.err.count("\n") == 1
    assert main(["store", "info", str(out), "--no-stats", "--verify", "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["nonfinite"] == {"resid_post": {"1": 4}} == report["verify"]["nonfinite"]
    assert any("(resid_post layer 1) holds 4 non-finite values, the manifest records 0" in p
               for p in report["verify"]["problems"])
    store = lens.open_store(out)
    store.get(layer=0), store.get(layer=2)  # the untouched layers read as before
    with pytest.raises(StoreCorruptError, match="resid_post layer 1 holds 4 non-finite values"):
        store.get(layer=1)
    with pytest.raises(StoreCorruptError, match="resid_post layer 1"):
        lens.open_store(out).view("resid_post").load()


def test_a_study_refuses_a_resealed_nan_layer_with_exit_2(tmp_path, capsys):
    from app.commands.cli import main

    store = tmp_path / "store"
    small = ["--model", "tiny-llama", "--store", str(store), "--corpus", "lee", "--max-tokens", "200", "--quiet"]
    capsys.readouterr()
    assert main(["study", "linearity", *small, "--out", str(tmp_path / "r1")]) == 0
    assert (tmp_path / "r1").is_dir()
    reseal_with_nan(store, layer=2)
    capsys.readouterr()
    rc = main(["study", "linearity", *small, "--out", str(tmp_path / "r2")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "resid_post layer 2 holds 4 non-finite values" in err
    assert not (tmp_path / "r2" / "result.json").exists()
