"""Every family in the matrix (tests/lens/families.py): its site map derives the expected block kind,
each site it has is captured equal to Hugging Face / plain hooks / the block identities, the logit
lens of the last layer reproduces the logits, the other backends capture the same tensors or refuse,
and docs/coverage.md is what these checks produce."""

import pytest

from lens.capturing.backends.tl import TRANSFORMER_LENS_HOOKS
from lens.model.card import BlockKind
from lens.sites import Site
from lens.model.tiny import encoder_family
from tests.lens.families import (FAMILIES, MOE, PREAMBLE, coverage_path, coverage_row, coverage_summary,
                                 family_report, native_failures, render_coverage, row_family, split_coverage,
                                 write_coverage_requested)

pytestmark = pytest.mark.families


def by_family(model_types):
    """One parameter per family, in name order. (No xdist group: `make test` schedules with worksteal,
    which recovers from a crashed worker where loadgroup hung; a family's report may then be built in
    both workers, which measured no slower.)"""
    return sorted(model_types)


@pytest.mark.parametrize("model_type", by_family(FAMILIES))
def test_family_native_capture_is_exact(model_type):
    r = family_report(model_type)
    assert r["error"] is None, r["error"]
    assert r["block"] is FAMILIES[model_type], f"derived {r['block']}, expected {FAMILIES[model_type]}"
    assert r["backends"]["native"] == "ok", r["backends"]["native"]
    assert not native_failures(r), native_failures(r)
    expected = {"embed", "resid_pre", "resid_post"}
    if r["block"] in (BlockKind.SEQUENTIAL, BlockKind.SANDWICH, BlockKind.POST_NORM):
        expected |= {"resid_mid", "attn_out", "mlp_out"}
    if r["block"] is BlockKind.PARALLEL:
        expected |= {"attn_out", "mlp_out"}
        assert "resid_mid" not in r["sites"] and "parallel" in r["absent"]["resid_mid"]
    if r["block"] is BlockKind.RECURRENT:
        assert not {"resid_mid", "attn_out", "mlp_out"} & set(r["sites"])
    if model_type in MOE:
        expected.add("router_logits")
    if r["block"] is not BlockKind.POST_NORM:
        expected.add("final_norm")
    assert expected <= set(r["sites"]), expected - set(r["sites"])
    for site, why in r["absent"].items():
        assert why, f"{site} is absent without a reason"


@pytest.mark.parametrize("model_type", by_family(t for t in FAMILIES if not encoder_family(t)))
def test_decoder_logit_lens_reproduces_logits(model_type):
    r = family_report(model_type)
    assert r["lens"], r["head_note"]
    assert r["lens_max_diff"] <= 1e-4


@pytest.mark.parametrize("backend", ["transformer-lens", "nnsight"])
@pytest.mark.parametrize("model_type", by_family(FAMILIES))
def test_other_backends_capture_the_same_tensors_or_refuse(model_type, backend):
    r = family_report(model_type)
    status = r["backends"][backend]
    if status == "ok":
        named = [s for s in r["sites"] if backend != "transformer-lens" or Site(s) in TRANSFORMER_LENS_HOOKS]
        wrong = [s for s in named if not r["site_ok"][(backend, s)]]
        assert not wrong, f"{backend} returned other tensors at {wrong} without refusing"
    else:  # a refusal must be a clear input error, never an internal one
        assert status.startswith("refused: "), status


STALE = "docs/coverage.md differs from the checks: LENS_WRITE_COVERAGE=1 make test-families"


def _coverage_file():
    path = coverage_path()
    assert path.is_file(), "docs/coverage.md is missing: run LENS_WRITE_COVERAGE=1 make test-families"
    return split_coverage(path.read_text())


def test_coverage_table_lists_the_matrix():
    """The file's preamble, its families in order and its count line (read off its rows); each row's
    content is checked against its family's report by test_coverage_row_is_current. With
    LENS_WRITE_COVERAGE=1 (one process: it builds every family's report) the file is rewritten first."""
    if write_coverage_requested():
        coverage_path().write_text(render_coverage(sorted(FAMILIES)))
    head, rows, rest = _coverage_file()
    assert head == PREAMBLE, STALE
    assert [row_family(r) for r in rows] == sorted(FAMILIES), STALE
    assert rest == ["", coverage_summary(rows), ""], STALE


@pytest.mark.parametrize("model_type", by_family(FAMILIES))
def test_coverage_row_is_current(model_type):
    _, rows, _ = _coverage_file()
    mine = [r for r in rows if row_family(r) == model_type]
    assert mine == [coverage_row(family_report(model_type))], STALE
