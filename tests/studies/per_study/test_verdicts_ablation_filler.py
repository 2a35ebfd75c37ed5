"""The judged claims of layer-ablation and filler-tokens (issue #37): each rule on synthetic records on either
side of its thresholds and with an interval that straddles one (undecided), read through
``studies.reporting.headlines.judged`` as the explorer and the report read them; and the statistics behind them (the
inner-layer mean and its resampled interval, the context-only loss change) on small known inputs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from studies.core.contract import AGREES, CONTRADICTS, NOT_APPLICABLE, UNDECIDED, WEAKER


from tests.studies.verdict_records import judged_row as _row, record as _record


# ---------------------------------------------------------------------------- layer-ablation
_ABL = {"delete": ("retained_mean_inner_delete", "retained accuracy, block deleted"),
        "swap": ("retained_mean_inner_swap", "retained accuracy, blocks swapped")}


@pytest.mark.parametrize("kind", ["delete", "swap"])
@pytest.mark.parametrize("value, low, high, want", [
    (0.885, 0.86, 0.91, AGREES),        # above the paper's lower end 0.72, interval too
    (0.99, 0.98, 1.0, AGREES),          # more robust than the paper's most robust model still keeps ≥ 72%
    (0.60, 0.55, 0.65, WEAKER),         # in [0.5, 0.72)
    (0.30, 0.20, 0.40, CONTRADICTS),    # below 0.5
    (0.74, 0.70, 0.78, UNDECIDED),      # straddles 0.72
    (0.52, 0.45, 0.58, UNDECIDED),      # straddles 0.5
])
def test_the_layer_ablation_rules_judge_the_inner_mean_with_its_interval(kind, value, low, high, want):
    key, measure = _ABL[kind]
    other = _ABL["swap" if kind == "delete" else "delete"][0]
    rec = _record("layer-ablation", {key: value, f"{key}_low": low, f"{key}_high": high,
                                     other: 0.9, f"{other}_low": 0.88, f"{other}_high": 0.92,
                                     "retained_min_inner": 0.024,  # the worst layer: a headline, not the verdict
                                     f"nested__{key}": [value + 0.01, value - 0.005, value],
                                     f"nested_n__{key}": [512, 1024, 2048]})
    row = _row(rec, measure)
    assert row["verdict"] == want
    assert (row["low"], row["high"]) == (low, high)
    assert row["nested"] == [value + 0.01, value - 0.005, value] and row["unstable"] is False
    assert "72–95%" in row["paper"] and "average" in row["paper"] and "first and last" in row["paper"]
    assert row["instrument"] == ""


def test_the_layer_ablation_verdicts_do_not_read_the_minimum():
    rec = _record("layer-ablation", {"retained_min_inner": 0.024, "retained_mean_inner_delete": 0.885,
                                     "retained_mean_inner_swap": 0.936})
    assert _row(rec, "retained accuracy, block deleted")["verdict"] == AGREES
    assert _row(rec, "retained accuracy, blocks swapped")["verdict"] == AGREES
    old = _record("layer-ablation", {"retained_min_inner": 0.9})  # a result from before the inner means
    row = _row(old, "retained accuracy, block deleted")
    assert row["verdict"] == NOT_APPLICABLE and "inner" in row["reason"]


def test_a_moving_nested_value_marks_the_ablation_verdict_unstable():
    rec = _record("layer-ablation", {"retained_mean_inner_delete": 0.88, "retained_mean_inner_delete_low": 0.86,
                                     "retained_mean_inner_delete_high": 0.90,
                                     "nested__retained_mean_inner_delete": [0.70, 0.85, 0.88]})
    assert _row(rec, "retained accuracy, block deleted")["unstable"] is True


# ---------------------------------------------------------------------------- filler-tokens
@pytest.mark.parametrize("value, low, high, want", [
    (0.12, 0.05, 0.19, AGREES),         # fillers removed from the context: the continuation's loss rises
    (-0.10, -0.18, -0.02, CONTRADICTS),  # it falls
    (0.0, -0.01, 0.01, UNDECIDED),      # the interval holds 0
    (0.05, -0.08, 0.18, UNDECIDED),
])
def test_the_filler_rule_judges_the_change_against_the_intact_input(value, low, high, want):
    rec = _record("filler-tokens", {"delta_ctx_filler": value, "delta_ctx_filler_low": low,
                                    "delta_ctx_filler_high": high,
                                    # our random control, whatever it says, is not part of the verdict
                                    "delta_ctx_random": value + 1.0, "delta_ctx_random_low": value + 0.9,
                                    "delta_ctx_random_high": value + 1.1,
                                    "delta_loss_filler": 2.9, "delta_loss_random": 3.5})
    row = _row(rec, "Δ loss of the intact continuation")
    assert row["verdict"] == want
    assert "MMLU" in row["instrument"] and "next-token loss" in row["instrument"]
    assert "intact input" in row["paper"] and "random" in row["paper"]


def test_the_filler_claim_is_not_applicable_to_an_older_result():
    row = _row(_record("filler-tokens", {"delta_loss_filler": 2.9, "delta_loss_random": 2.8}), "Δ loss")
    assert row["verdict"] == NOT_APPLICABLE and "#37" in row["reason"]


def test_the_filler_study_judges_one_claim_and_labels_its_control_as_ours():
    from studies.core.registry import declaration

    d = declaration("filler-tokens")
    assert len(d.claims) == 1 and d.claims[0].key == "delta_ctx_filler"
    assert "our control" in d.result.label("delta_ctx_random")
    abl = declaration("layer-ablation")
    assert [c.key for c in abl.claims] == ["retained_mean_inner_delete", "retained_mean_inner_swap"]


# ---------------------------------------------------------------------------- the statistics
def _scan(correct_delete, correct_swap, base, n):
    return SimpleNamespace(layers=np.arange(len(correct_delete)), window_correct_delete=np.asarray(correct_delete, float),
                           window_correct_swap=np.asarray(correct_swap, float),
                           window_base_correct=np.asarray(base), window_n=np.asarray(n))


def test_the_inner_mean_leaves_the_first_and_last_layers_out_and_resamples_documents():
    from studies.layer_ablation.study import inner_mean_stats

    L, W = 5, 24
    rng = np.random.default_rng(0)
    base = rng.integers(20, 40, size=W)
    n = base + 30
    delete = np.tile(base, (L, 1)).astype(float)
    delete[0] = 0  # deleting the first block: catastrophic, outside the inner mean
    delete[1:-1] = np.round(base * np.array([[0.9], [0.8], [0.7]]))
    delete[-1] = 0
    swap = np.full((L, W), np.nan)
    swap[:-1] = np.round(base * 0.5)
    swap[1:-2] = np.round(base * np.array([[0.95], [0.85]]))
    doc = np.repeat(np.arange(12), 2)  # 12 documents: they are the units
    out = inner_mean_stats(_scan(delete, swap, base, n), doc, L, n_boot=200, seed=0)
    assert out["units"] == "doc" and out["n_units"] == 12
    want = delete[1:-1].mean(0).sum() / base.sum()
    assert out["retained_mean_inner_delete"] == pytest.approx(want)
    assert out["retained_mean_inner_swap"] == pytest.approx(swap[1:-2].mean(0).sum() / base.sum())
    assert out["retained_mean_inner_delete_low"] <= want <= out["retained_mean_inner_delete_high"]
    assert out["nested__retained_mean_inner_delete"][-1] == pytest.approx(want, abs=1e-6)
    assert out["nested_n__retained_mean_inner_delete"][-1] == int(n.sum())  # scored tokens, not windows
    sub = _scan(delete[[0, 2, 4]], swap[[0, 2, 4]], base, n)  # a scan of blocks 0, 2, 4 of the five
    sub.layers = np.array([0, 2, 4])
    part = inner_mean_stats(sub, doc, L, n_boot=50, seed=0)
    assert part["retained_mean_inner_delete"] == pytest.approx(delete[2].sum() / base.sum())
    assert part["retained_mean_inner_swap"] == pytest.approx(swap[2].sum() / base.sum())
    few = inner_mean_stats(_scan(delete, swap, base, n), np.zeros(W, int), L, n_boot=50, seed=0)
    assert few["units"] == "window" and few["n_units"] == W  # one document: windows are resampled


def test_the_context_keeps_remove_fillers_from_the_context_only():
    from studies.filler_tokens.study import context_keeps

    is_filler = np.array([1, 0, 1, 1, 0, 0, 1, 0, 1, 1], bool)
    keep, draws = context_keeps(is_filler, 5, 4, np.random.default_rng(0))
    assert keep.tolist() == [False, True, False, False, True, True, True, True, True, True]
    for k in draws:
        assert k[5:].all() and (~k[:5]).sum() == 3  # as many random context tokens, the continuation kept


def test_the_delta_statistic_is_a_token_weighted_mean_with_a_unit_interval():
    from studies.filler_tokens.study import delta_stats

    rng = np.random.default_rng(1)
    counts = rng.integers(30, 60, size=40).astype(float)
    sums = counts * (0.1 + rng.normal(0, 0.05, size=40))
    units = np.repeat(np.arange(20), 2)
    out = delta_stats(sums, counts, units, n_boot=300, seed=0, key="delta_ctx_filler")
    assert out["value"] == pytest.approx(sums.sum() / counts.sum())
    assert out["low"] < out["value"] < out["high"]
    assert out["nested"]["nested_n__delta_ctx_filler"][-1] == int(counts.sum())
