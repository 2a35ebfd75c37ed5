"""Fidelity records that stay honest (issue #39): a merged store carries every part's verdict and is its
worst part's, results from a silently wrong store carry a mark, a malformed or forged record is a damaged
store (exit 2 in ``store info``, ``store verify`` and studies alike), a record is judged by the tolerance
documented for its dtype (lens.store.fidelity.TOLERANCES), never the one in the file.

Stores are captured in process from the session's tiny-llama (a planted off-by-one ``resid_post`` tap makes a
silently wrong part); the commands run through the real command line (``app.commands.cli.main``)."""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

import lens
from lens.sites import Site
from lens.store.fidelity import (OK, SILENTLY_WRONG, TOLERANCES, check_record, describe, merged_record,
                                 record_of)
from lens.store.format import commit_manifest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "lens"))
from planted_cli import OffByOne  # noqa: E402

# two parts of two shards each (4 windows of 32 tokens, 2 per shard)
KW = dict(corpus="lee", max_tokens=256, seq_len=32, batch_size=2, shard_tokens=64, sites=["resid_post"],
          progress=False)


def _planted(model):
    sm = model.site_map
    tap = sm.taps[Site.RESID_POST]
    return dataclasses.replace(model, site_map=dataclasses.replace(
        sm, taps={**sm.taps, Site.RESID_POST: OffByOne(tap.path, tap.kind, tap.flat_tokens, sm.n_layers)}))


def _cli(argv, capsys) -> tuple[int, str, str]:
    from app.commands.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in argv])
    got = capsys.readouterr()
    return rc, got.out, got.err


def _one_error(err: str) -> str:
    lines = [l for l in err.splitlines() if l.strip() and "%|" not in l]
    assert len(lines) == 1 and lines[0].startswith("lens: error:") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def parts(tiny_llama, tmp_path_factory):
    """Part 1/2 captured right, part 2/2 with a planted off-by-one kept with --allow-silently-wrong, and a
    whole store captured right."""
    root = tmp_path_factory.mktemp("records")
    lens.capture(tiny_llama, out=root / "p1", part="1/2", **KW)
    lens.capture(_planted(tiny_llama), out=root / "p2", part="2/2", allow_silently_wrong=True, **KW)
    lens.capture(tiny_llama, out=root / "whole", **KW)
    return root


def _copy_with(src: Path, dst: Path, change) -> Path:
    """A copy of the store ``src`` whose manifest ``change(manifest)`` alters, re-sealed (a forged record
    whose checksum is right)."""
    import shutil

    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    change(m)
    commit_manifest(dst, m)
    return dst


def test_a_merge_with_a_silently_wrong_part_is_silently_wrong(parts, tmp_path, capsys):
    rc, _, err = _cli(["store", "merge", parts / "p2", parts / "p1", "--out", tmp_path / "m", "--quiet"], capsys)
    assert rc == 0, err
    m = json.loads((tmp_path / "m" / "manifest.json").read_text())
    record = record_of(m)
    assert record.verdict == SILENTLY_WRONG and record.accepted and record.part == "2/2"
    assert [(p.part, p.verdict, p.accepted) for p in record.parts] == [("1/2", OK, False), ("2/2", SILENTLY_WRONG, True)]
    lines = describe(m)
    assert lines[0].startswith("SILENTLY WRONG — KEPT ANYWAY (--allow-silently-wrong): resid_post at layer ")
    assert "part 2/2, the worst of 2 parts" in lines[0]
    assert lines[1].startswith("part 1/2: ok: within 1e-05") and lines[2].startswith("part 2/2: SILENTLY WRONG")
    rc, out, err = _cli(["store", "info", tmp_path / "m", "--no-stats"], capsys)
    assert rc == 0, err
    assert "fidelity   SILENTLY WRONG — KEPT ANYWAY" in out and "part 2/2: SILENTLY WRONG" in out, out
    # a merged record forged to read ok while a part is silently wrong: a damaged store
    def forge(man):
        man["fidelity"] = copy.deepcopy(man["fidelity"]["parts"][0]) | {"parts": man["fidelity"]["parts"]}

    forged = _copy_with(tmp_path / "m", tmp_path / "forged", forge)
    rc, _, err = _cli(["store", "info", forged], capsys)
    assert rc == 2 and "part 2/2 of the merged store reads 'silently-wrong'" in _one_error(err)


def test_a_merge_of_good_parts_reads_ok_with_every_part(parts, tmp_path, capsys, tiny_llama):
    p2 = tmp_path / "p2"
    lens.capture(tiny_llama, out=p2, part="2/2", **KW)
    assert _cli(["store", "merge", parts / "p1", p2, "--out", tmp_path / "m", "--quiet"], capsys)[0] == 0
    record = record_of(json.loads((tmp_path / "m" / "manifest.json").read_text()))
    assert record.verdict == OK and record.part == "1/2" and [p.verdict for p in record.parts] == [OK, OK]


def test_results_from_a_silently_wrong_store_carry_a_mark(parts, tmp_path, capsys):
    from studies.reporting.headlines import judged, verdict_text
    from studies.reporting.results import read_result

    assert _cli(["store", "merge", parts / "p1", parts / "p2", "--out", tmp_path / "m", "--quiet"], capsys)[0] == 0
    for store, want in ((tmp_path / "m", SILENTLY_WRONG), (parts / "whole", OK)):
        out = tmp_path / f"res-{store.name}"
        rc, _, err = _cli(["study", "linearity", "--model", "tiny-llama", "--store", store, "--out", out,
                           "--quiet"], capsys)
        assert rc == 0, err
        rec = read_result(out)
        fidelity = rec.extra["store_fidelity"]
        assert fidelity["verdict"] == want and fidelity["accepted"] == (want == SILENTLY_WRONG)
        rows = judged(rec)
        assert rows
        for j in rows:  # the report, the explorer's findings table and docs/findings.md show verdict_text
            marked = "SILENTLY WRONG (kept with --allow-silently-wrong)" in verdict_text(j)
            assert marked == (want == SILENTLY_WRONG), verdict_text(j)
        # the explorer's overview lists it; the findings' verdict matrix marks it
        from types import SimpleNamespace

        from app.explorer.data import silently_wrong_results
        from studies.reporting.findings import Finding, _verdict_word

        listed = silently_wrong_results([SimpleNamespace(run="r", record=rec)])
        assert len(listed) == (want == SILENTLY_WRONG)
        word = _verdict_word(Finding("linearity", "m", "c", "s", "r", "cp", "tiny-llama", value="1",
                                     verdict=verdict_text(rows[0]), judged=rows[0]))
        assert word.endswith("(store SILENTLY WRONG)") == (want == SILENTLY_WRONG), word


def _resealed(parts, tmp_path, change) -> Path:
    return _copy_with(parts / "whole", tmp_path / "bad", lambda m: change(m["fidelity"]))


@pytest.mark.parametrize("change,expect", [
    (lambda f: f.update(tolerance="1e-05"), "fidelity.tolerance must be a number, found str '1e-05'"),
    (lambda f: f["sites"][0].update(max_rel=str(f["sites"][0]["max_rel"])), "fidelity.sites[0].max_rel must be a number"),
    (lambda f: f.update(accepted="no"), "fidelity.accepted must be true or false"),
    (lambda f: f["lens"].update(top1_agreement=[1]), "fidelity.lens.top1_agreement must be a number"),
    (lambda f: f.update(verdict="fine"), "fidelity.verdict must be one of ok, silently-wrong, not-checked"),
    (lambda f: f.update(model_dtype="float8"), "model_dtype must be one of float32"),
    # forged: a tolerance of 10 in the file and a difference of 0.5 read "ok" before
    (lambda f: (f.update(tolerance=10.0), f["sites"][0].update(max_rel=0.5)),
     "fidelity.verdict reads 'ok', but resid_post differs from Hugging Face by 0.5, past the documented tolerance "
     "1e-05 for float32 models (the record names tolerance 10"),
    # a line marked past the tolerance under a verdict of ok
    (lambda f: f["sites"][0].update(failed=True), "fidelity.verdict reads 'ok', but resid_post differs"),
    (lambda f: f["lens"].update(max_rel=0.2), "the last layer's lens differs from the logits by 0.2"),
], ids=["tolerance-str", "max-rel-str", "accepted-str", "top1-list", "verdict", "dtype", "forged-tolerance",
        "failed-line", "lens-past"])
def test_a_malformed_or_forged_record_is_a_damaged_store_everywhere(change, expect, parts, tmp_path, capsys):
    bad = _resealed(parts, tmp_path, change)
    for argv in (["store", "info", bad], ["store", "info", bad, "--json"], ["store", "verify", bad],
                 ["study", "linearity", "--model", "tiny-llama", "--store", bad, "--out", tmp_path / "r", "--quiet"]):
        rc, out, err = _cli(argv, capsys)
        line = _one_error(err)
        assert rc == 2 and "its fidelity record is malformed" in line and expect in line, (argv, line)
    assert not (tmp_path / "r").exists()


def test_a_record_is_judged_by_the_documented_tolerance_not_the_files(parts, tmp_path, capsys):
    """A record naming a tolerance other than its dtype's documented one, every line within the documented one,
    reads (and shows) the documented one."""
    bad = _resealed(parts, tmp_path, lambda f: f.update(tolerance=1e-12))
    rc, out, err = _cli(["store", "info", bad, "--no-stats"], capsys)
    assert rc == 0, err
    assert "ok: within 1e-05 of Hugging Face" in out and "tolerance 1e-05 (relative, per token; documented for float32)" in out


def test_documented_tolerances_are_the_captures():
    from lens.capturing.fidelity import tolerance_for

    for name, dtype in (("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        assert tolerance_for(dtype) == TOLERANCES[name]
    assert TOLERANCES["bfloat16"] == 4 * torch.finfo(torch.bfloat16).eps
    assert TOLERANCES["float16"] == 4 * torch.finfo(torch.float16).eps


def test_a_merged_record_of_parts_without_records():
    ok = json.loads(json.dumps({"verdict": "ok", "tolerance": 1e-5, "model_dtype": "float32", "attn": "eager",
                                "backend": "native", "windows": 2, "tokens": 60}))
    assert merged_record([("1/2", None), ("2/2", None)]) is None
    m = merged_record([("1/2", ok), ("2/2", None)])
    assert m["verdict"] == "not-checked" and m["part"] == "2/2" and "before stores kept" in m["why_not"]
    assert check_record(m).parts[0].verdict == OK
