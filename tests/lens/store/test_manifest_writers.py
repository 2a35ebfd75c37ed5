"""The manifest's writers hold a value and derive the next one (lens.store.manifest, issue #41): a new store's first
manifest built once and checked by the schema's rules (``Manifest.first``), each finished shard added whole
(``with_shard``), fields changed or dropped (``with_`` / ``without``), the seal set (``sealed``); the writer keeps
the last manifest it committed, so a failed commit leaves nothing to undo.

That the files a capture, a merge and an import write are byte-identical to the dict-draft writers' was checked
against the previous commit by hand (the issue's closing note); here: the derivation reproduces what the writer
wrote, key for key, and the writer's failure paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lens
from lens.errors import StoreCorruptError, StoreWriteError
from lens.sites import Site
from lens.store import faults
from lens.store.format import FORMAT_VERSION, load_manifest
from lens.store.manifest import Manifest, PartRecord, ShardEntry
from lens.store.schema import CHECKSUM_KEY

KW = dict(corpus="lee", max_tokens=200, seq_len=32, batch_size=2, shard_tokens=64, sites=["resid_post", "embed"],
          layers="0,2", progress=False)


@pytest.fixture(scope="module")
def whole(tiny_llama, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("writers") / "whole"
    lens.capture(tiny_llama, out=root, **KW)
    return root


def _empty(m: Manifest) -> Manifest:
    """``m`` as its capture began: no shard, nothing counted, not complete."""
    return m.with_(shards=(), n_tokens=0, complete=False,
                   nonfinite={s: [0] * len(layers) for s, layers in m.sites.items()})


def test_deriving_shard_by_shard_gives_the_file_the_writer_committed(whole):
    written = load_manifest(whole)
    assert len(written.shards) > 2
    m = _empty(written)
    for shard in written.shards:
        m = m.with_shard(shard)
    m = m.with_(complete=True).sealed(FORMAT_VERSION)
    assert m.checksum == written.checksum
    assert json.dumps(m.to_dict(), indent=1) == (whole / "manifest.json").read_text()


def test_with_shard_sums_tokens_and_nonfinite_counts(whole):
    written = load_manifest(whole)
    first = written.shards[0]
    counts = {s: [i + 1 for i in range(len(layers))] for s, layers in written.sites.items()}
    entry = ShardEntry.build(first.name, first.n_tokens, first.window_start, first.window_end, files=first.files,
                             stats=first.stats, nonfinite={s.value: c for s, c in counts.items()})
    m = _empty(written).with_shard(entry).with_shard(entry.__class__.from_dict({**entry.to_dict(), "name": "00001"}))
    assert m.n_tokens == 2 * first.n_tokens and [s.name for s in m.shards] == ["00000", "00001"]
    assert m.nonfinite == {s: tuple(2 * c for c in counts[s]) for s in written.sites}
    assert all(isinstance(s, Site) for s in m.nonfinite)
    assert _empty(written).shards == () and written.n_tokens > 0  # values: nothing changed in place


def test_with_and_without_write_and_drop_fields(whole):
    written = load_manifest(whole)
    assert written.part is None and "part" not in written.to_dict()
    part = {"index": 1, "count": 2, "window_start": 0, "window_end": 4, "n_windows_total": 7, "n_tokens_total": 200}
    with_part = written.with_(part=part)
    assert with_part.part == PartRecord.from_dict(part) and with_part.part.label == "1/2"
    assert with_part.to_dict()["part"] == part
    assert list(with_part.to_dict())[-1] == "part"  # a field the file did not hold comes after those it did
    dropped = with_part.without("part", "checksum")
    assert "part" not in dropped.to_dict() and CHECKSUM_KEY not in dropped.to_dict()
    assert dropped.to_dict() == {k: v for k, v in written.to_dict().items() if k != CHECKSUM_KEY}
    with pytest.raises(ValueError, match="not optional"):
        written.without("sites")
    with pytest.raises(TypeError):
        written.with_(no_such_field=1)


def test_first_checks_a_new_manifest_once_and_writes_its_keys_in_order(whole):
    d = _empty(load_manifest(whole)).without("checksum").to_dict()
    m = Manifest.first(d)
    assert m.to_dict() == d and list(m.to_dict()) == list(d) and m.checksum is None
    assert CHECKSUM_KEY in m.sealed(FORMAT_VERSION).to_dict()
    with pytest.raises(StoreCorruptError, match="^the merged manifest: n_tokens is 5 but the shards hold 0"):
        Manifest.first({**d, "n_tokens": 5}, "the merged manifest")
    with pytest.raises(StoreCorruptError, match="nonfinite"):
        Manifest.first({**d, "nonfinite": {"resid_post": [0, 0]}})


def test_a_failed_commit_keeps_the_last_committed_manifest_and_resume_completes(tiny_llama, whole, tmp_path,
                                                                                monkeypatch):
    out = tmp_path / "s"
    monkeypatch.setattr(faults, "_hits", {})
    monkeypatch.setenv(faults.ENV, "manifest.tmp-written@3=enospc")  # commits: the first manifest, shard 0, shard 1
    with pytest.raises(StoreWriteError, match=r"1 shards \(64 tokens\) are committed and intact"):
        lens.capture(tiny_llama, out=out, **KW)
    kept = load_manifest(out)
    assert [s.name for s in kept.shards] == ["00000"] and not kept.complete
    monkeypatch.delenv(faults.ENV)
    lens.capture(tiny_llama, out=out, resume=True, **KW)
    got, want = load_manifest(out).to_dict(), load_manifest(whole).to_dict()
    for d in (got, want):
        del d["created"], d[CHECKSUM_KEY]
    assert got == want
    for shard in load_manifest(whole).shards:
        for fname in shard.files:
            assert (out / "shards" / shard.name / fname).read_bytes() == \
                (whole / "shards" / shard.name / fname).read_bytes()
