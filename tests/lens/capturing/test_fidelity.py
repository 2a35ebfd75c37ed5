"""The fidelity record every capture keeps (lens.capturing.fidelity, lens.store.fidelity): a correct capture of
tiny models records ok with every difference within the stated tolerance, by every backend that runs offline;
a deliberately wrong site map (a planted off-by-one layer) makes the real ``lens capture`` exit 2 with one line
and leave nothing behind; stores written before the record say "not recorded"."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lens
from lens.capturing.fidelity import tolerance_for
from lens.errors import SilentlyWrong
from lens.sites import Site
from lens.store.fidelity import NOT_RECORDED, OK, SILENTLY_WRONG, describe, record_of
from lens.store.format import commit_manifest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "lens"))
from planted_cli import OffByOne  # noqa: E402

KW = dict(corpus="lee", max_tokens=160, seq_len=32, batch_size=4, progress=False)
ALL = ["embed", "resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "final_norm"]


def _sites(model):
    return [s for s in ALL if model.card().has_site(s)]


def _assert_ok(record, model, backend="native", sites=None):
    assert record.verdict == OK, record.failure
    assert record.backend == backend and record.tolerance == tolerance_for(model.dtype)
    assert record.windows == 2 and record.tokens > 0
    checked = [s for s in record.sites if s.checked]
    assert checked and all(s.max_rel is not None and s.max_rel <= record.tolerance and not s.failed for s in checked)
    assert {s.site for s in record.sites} == set(sites or _sites(model))
    for s in record.sites:
        assert s.checked or s.why_not, f"{s.site} neither checked nor said why"


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gpt2", "tiny_bert"])
def test_a_correct_capture_records_ok(name, request, tmp_path):
    model = request.getfixturevalue(name)
    lens.capture(model, sites=_sites(model), out=tmp_path / "s", **KW)
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    record = record_of(manifest)
    _assert_ok(record, model)
    # hidden-state sites are compared with Hugging Face's hidden states, not skipped
    for site in ("embed", "resid_post"):
        assert record.site(site).checked and "hidden_states" in record.site(site).against
    if model.card().has_lm_head:
        assert record.lens.checked and record.lens.top1_agreement == 1.0 and record.lens.max_rel <= record.tolerance
    else:  # an encoder without an LM head: n/a, with the reason
        assert not record.lens.checked and record.lens.why_not
        assert {"resid_mid", "attn_out"} <= {s.site for s in record.sites if not s.checked}  # post-norm: said so
    if model.card().block.value == "sequential":  # the sites no hidden state exposes, through their identities
        assert all(record.site(s).checked for s in ("resid_mid", "attn_out", "mlp_out"))
    lines = describe(manifest)
    assert lines[0].startswith("ok: within 1e-05 of Hugging Face")
    assert lens.open_store(tmp_path / "s").manifest["fidelity"] == manifest["fidelity"]  # schema accepts it


@pytest.mark.parametrize("backend", ["transformer-lens", "nnsight"])
def test_every_backend_records_ok(backend, tiny_gpt2):
    sites = ["resid_post", "embed"] if backend == "transformer-lens" else _sites(tiny_gpt2)
    store = lens.capture(tiny_gpt2, sites=sites, backend=backend, **KW)
    record = record_of(store.manifest)
    _assert_ok(record, tiny_gpt2, backend, sites)
    assert record.lens.checked and record.lens.top1_agreement == 1.0


def _planted(model, site=Site.RESID_POST):
    """``model`` with the tap of ``site`` moved to the next block (the last layer reads itself)."""
    sm = model.site_map
    tap = sm.taps[site]
    return dataclasses.replace(model, site_map=dataclasses.replace(
        sm, taps={**sm.taps, site: OffByOne(tap.path, tap.kind, tap.flat_tokens, sm.n_layers)}))


@pytest.mark.parametrize("site,against", [(Site.RESID_POST, "hidden_states[1]"),
                                          (Site.ATTN_OUT, "resid_mid - resid_pre"),
                                          (Site.MLP_OUT, "resid_post - resid_mid")])
def test_a_planted_off_by_one_is_silently_wrong(site, against, tiny_llama, tmp_path):
    wrong = _planted(tiny_llama, site)
    with pytest.raises(SilentlyWrong) as err:
        lens.capture(wrong, sites=_sites(tiny_llama), out=tmp_path / "s", **KW)
    assert f"{site.value} at layer 0 differs from Hugging Face's {against} by " in str(err.value), err.value
    assert "tolerance 1e-05" in str(err.value)
    assert not (tmp_path / "s").exists()  # nothing half-written


def test_silently_wrong_is_kept_only_when_allowed_and_then_marked(tiny_llama):
    store = lens.capture(_planted(tiny_llama), sites=["resid_post"], allow_silently_wrong=True, **KW)
    record = record_of(store.manifest)
    assert record.verdict == SILENTLY_WRONG and record.accepted
    bad = record.site("resid_post")
    assert bad.failed and bad.layer is not None and bad.max_rel > record.tolerance
    assert describe(store.manifest)[0].startswith("SILENTLY WRONG — KEPT ANYWAY")


def test_a_bfloat16_model_is_judged_at_its_own_tolerance(tmp_path):
    model = lens.load_model("tiny-llama", dtype="bfloat16")
    assert tolerance_for(model.dtype) == 4 * torch.finfo(torch.bfloat16).eps
    record = record_of(lens.capture(model, sites=_sites(model), **KW).manifest)
    _assert_ok(record, model)
    assert record.model_dtype == "bfloat16"
    with pytest.raises(SilentlyWrong, match="resid_post at layer 0"):  # a wrong layer is far past it all the same
        lens.capture(_planted(model), sites=["resid_post"], **KW)


def test_a_planted_off_by_one_fails_the_real_capture_with_exit_2(tmp_path):
    """Through the real command line in a fresh process: exit 2, one line naming the site kind, the layer,
    the difference and the tolerance, and no store folder left."""
    out = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LENS_DEBUG": ""}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "lens" / "planted_cli.py"), "capture", "tiny-llama",
                           "--corpus", "lee", "--max-tokens", "128", "--seq-len", "32", "--out", str(out), "--quiet"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("lens: error: silently wrong: resid_post at layer 0 differs from Hugging Face's "
                               "hidden_states[1] by "), lines[0]
    assert "tolerance 1e-05" in lines[0]
    assert not out.exists()


def test_a_store_from_before_the_record_says_not_recorded(tiny_llama, tmp_path):
    lens.capture(tiny_llama, out=tmp_path / "s", **KW)
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert record_of(manifest).verdict == OK
    # a store from before the record: the field absent, every reader says so rather than failing
    del manifest["fidelity"]
    commit_manifest(tmp_path / "s", manifest)
    store = lens.open_store(tmp_path / "s")
    assert record_of(store.manifest) is None and describe(store.manifest) == [NOT_RECORDED]


def test_the_report_shows_each_stores_record(tiny_llama, tmp_path):
    """`lens report`'s provenance part: the verdict of each store the results read (found as recorded, or
    under the results folder after it moved), the record under it; a store from before says not recorded."""
    from studies.reporting.report import build_report

    lens.capture(tiny_llama, out=tmp_path / "run" / "store", **KW)
    old = tmp_path / "run" / "old" / "store"
    lens.capture(tiny_llama, out=old, **KW)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["fidelity"]
    commit_manifest(old, manifest)
    (tmp_path / "run" / "main_job.json").write_text(json.dumps({"store": "elsewhere/run/store", "studies": []}))
    from studies.reporting.results import write_result

    write_result(tmp_path / "run" / "linearity", study="linearity", model="tiny-llama", corpus="lee", n_tokens=1,
                 config={"store": str(old)}, summary={}, arrays={})
    page = build_report(tmp_path / "run").read_text()
    section = page.split("<h3>Store fidelity</h3>", 1)[1].split("</table>", 1)[0]
    assert str(tmp_path / "run" / "store") in section and "ok: within 1e-05 of Hugging Face" in section
    assert "resid_post: max rel 0 over 4 layers vs hidden_states[l+1]" in section
    assert str(old) in section and NOT_RECORDED in section


def test_store_info_prints_the_record(tiny_llama, tmp_path, capsys):
    """`lens store info`: the verdict and the record under the sites, in --json too; "not recorded" for a store
    from before records."""
    from app.commands.cli import main

    lens.capture(tiny_llama, out=tmp_path / "s", sites=["resid_post", "embed"], **KW)
    capsys.readouterr()
    assert main(["store", "info", str(tmp_path / "s"), "--no-stats"]) == 0
    out = capsys.readouterr().out
    assert "fidelity   ok: within 1e-05 of Hugging Face on" in out
    assert "resid_post: max rel 0 over 4 layers vs hidden_states[l+1]" in out
    assert "last-layer lens vs logits: max abs 0, max rel 0, top-1 agreement 100.0%" in out
    assert main(["store", "info", str(tmp_path / "s"), "--no-stats", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["fidelity"]["verdict"] == OK and got["fidelity_lines"][0].startswith("ok: within")
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    del manifest["fidelity"]
    commit_manifest(tmp_path / "s", manifest)
    assert main(["store", "info", str(tmp_path / "s"), "--no-stats"]) == 0
    assert f"fidelity   {NOT_RECORDED}" in capsys.readouterr().out
    assert main(["store", "info", str(tmp_path / "s"), "--no-stats", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["fidelity"] is None and got["fidelity_lines"] == [NOT_RECORDED]
