"""The manifest as a frozen value (lens.store.manifest, issue #41): parsed and checked once, read by attribute,
written back byte for byte; the store's site API typed (``Site`` or its name in, ``Site`` out).

Every manifest any test writes is also round-tripped as it is written (tests/conftest.py's
``_every_manifest_round_trips``); here: the kinds of store a capture writes (whole, thinned, a part, a merge,
an import) and an older manifest's missing and unknown fields, checked explicitly."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import lens
from lens.errors import LensInputError, StoreCorruptError
from lens.sites import Site
from lens.store.format import load_manifest, read_manifest
from lens.store.manifest import FrozenDict, FrozenList, Manifest, PartRecord, ShardEntry
from lens.store.parts import merge_stores

KW = dict(corpus="lee", max_tokens=200, seq_len=32, batch_size=2, shard_tokens=64, sites=["resid_post", "embed"],
          layers="0,2", progress=False)


@pytest.fixture(scope="module")
def stores(tiny_llama, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("manifests")
    lens.capture(tiny_llama, out=root / "whole", **KW)
    lens.capture(tiny_llama, out=root / "last", **{**KW, "positions": "last", "dtype": "bfloat16"})
    for i in (1, 2):
        lens.capture(tiny_llama, out=root / f"p{i}", part=f"{i}/2", **KW)
    merge_stores([root / "p1", root / "p2"], root / "merged")
    return {p.name: p for p in root.iterdir()}


def _round_trip(root: Path) -> Manifest:
    raw = (root / "manifest.json").read_text()
    value = load_manifest(root)
    assert json.dumps(value.to_dict(), indent=1) == raw  # the file as written (commit_manifest's indent=1)
    assert json.dumps(Manifest.from_dict(json.loads(raw)).to_dict()) == json.dumps(json.loads(raw))
    assert read_manifest(root) == json.loads(raw)
    return value


def test_every_kind_of_store_round_trips_byte_for_byte(stores):
    import lens.store.format as fmt

    assert getattr(fmt.write_json_atomic, "round_trip_checked", False)  # the suite-wide check is installed
    for name in ("whole", "last", "p1", "p2", "merged"):
        m = _round_trip(stores[name])
        assert m.complete and m.n_tokens == sum(s.n_tokens for s in m.shards)
    part = load_manifest(stores["p2"]).part
    assert isinstance(part, PartRecord) and (part.index, part.count, part.label) == (2, 2, "2/2")
    assert part.window_end == part.n_windows_total and part.to_dict() == read_manifest(stores["p2"])["part"]
    merged = load_manifest(stores["merged"])
    assert [p["part"] for p in merged.merged_from] == ["1/2", "2/2"] and merged.extra == {}
    assert load_manifest(stores["last"]).positions == "last" and load_manifest(stores["last"]).dtype == "bfloat16"


def test_attributes_are_typed_and_frozen(stores):
    m = load_manifest(stores["whole"])
    assert m.site_list == (Site.RESID_POST, Site.EMBED) and m.sites[Site.RESID_POST] == (0, 2)
    assert m.sites[Site.EMBED] == (None,) and m.layers_of("resid_post") == (0, 2)
    assert all(isinstance(s, ShardEntry) for s in m.shards) and m.shards[0].name == "00000"
    assert m.card.model_id == m.model_id and m.n_layers == m.card.n_layers
    assert m.fidelity_record is not None and m.fidelity_record.verdict == "ok"
    assert m.width(Site.RESID_POST) == m.d_model and m.has_stats("embed")
    assert m.checksum == json.loads((stores["whole"] / "manifest.json").read_text())["manifest_sha256"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.n_tokens = 1  # type: ignore[misc]
    for change in (lambda: m.settings.update(x=1), lambda: m["shards"].append({}),
                   lambda: m.shards[0].files["embed.npy"].pop("bytes"), lambda: m["sites"]["resid_post"].append(3)):
        with pytest.raises(TypeError, match="frozen value"):
            change()
    # the JSON view: equal to the file's JSON, read-only, what a dict reader (a notebook, site_width) took
    assert m["sites"] == {"resid_post": [0, 2], "embed": [None]} and isinstance(m["shards"], FrozenList)
    assert isinstance(m["model"], FrozenDict) and m.get("nope", 3) == 3 and "fidelity" in m


def test_an_older_manifest_keeps_what_it_lacks_and_what_this_version_does_not_know(stores):
    d = json.loads((stores["whole"] / "manifest.json").read_text())
    for key in ("widths", "fidelity", "sample", "sample_seed", "settings", "n_windows_planned", "library_versions"):
        d.pop(key, None)
    d = {"written_by": "a future version", **dict(reversed(list(d.items())))}
    m = Manifest.from_dict(d, validate=False)
    assert m.fidelity is None and m.settings is None and m.widths == {} and m.extra == {"written_by": "a future version"}
    assert json.dumps(m.to_dict()) == json.dumps(d)  # nothing added, nothing lost, the order kept
    assert m.width("embed") == m.d_model and m.fidelity_record is None


def test_a_damaged_manifest_is_one_line_naming_the_file(stores):
    d = read_manifest(stores["whole"])
    d["shards"][0]["n_tokens"] = "many"
    with pytest.raises(StoreCorruptError) as info:
        Manifest.from_dict(d, "s/manifest.json")
    assert str(info.value).startswith("s/manifest.json: shards[0].n_tokens must be an integer")
    assert "\n" not in str(info.value)


def test_the_store_api_takes_a_site_or_its_name(stores):
    store = lens.open_store(stores["whole"])
    assert store.sites == (Site.RESID_POST, Site.EMBED) and all(isinstance(s, Site) for s in store.sites)
    assert store.sites == ("resid_post", "embed")  # a Site reads as its name
    assert store.layers(Site.RESID_POST) == store.layers("resid_post") == [0, 2]
    assert (store.get(Site.RESID_POST, 2) == store.get("resid_post", 2)).all()
    assert store.stats(Site.EMBED).layers == store.stats("embed").layers
    assert store.nonfinite(Site.RESID_POST) == {0: 0, 2: 0} and store.has(Site.EMBED) and not store.has("mlp_out")
    for call in (lambda: store.layers("mlp_out"), lambda: store.get("mlp_out", 0), lambda: store.stats("nonsense"),
                 lambda: store.nonfinite("attn_out"), lambda: store.view("nonsense"), lambda: store.has_stats(3)):
        with pytest.raises(LensInputError) as info:
            call()
        assert "is not in this store (it has resid_post, embed)" in str(info.value)
        assert "\n" not in str(info.value)
