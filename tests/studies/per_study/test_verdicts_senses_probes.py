"""The senses and probes claims, judged on the papers' statistics (issue #37): synthetic records on each side of
every threshold and one whose interval straddles it (undecided), through ``studies.reporting.headlines.judged``; the
held-out layer choice, the sense-blind baseline and the out-of-fold selectivity on known answers; and the
probes study end to end on tiny-llama (interval, nested subsamples, no tokens-per-dimension mark)."""

from __future__ import annotations


import numpy as np
import pytest

from studies.core.contract import AGREES, CONTRADICTS, NOT_APPLICABLE, UNDECIDED


from tests.studies.verdict_records import judged_row, record as _record


def _row(study, summary):
    return judged_row(_record(study, summary))


SENSES = ("senses", "sense_margin")
PROBES = ("probes", "mean_selectivity")


@pytest.mark.parametrize("study,key", [SENSES, PROBES])
@pytest.mark.parametrize("value,low,high,verdict", [
    (0.12, 0.05, 0.20, AGREES),          # the whole interval above 0
    (0.004, 0.001, 0.008, AGREES),       # small, but every resample above 0
    (-0.03, -0.09, -0.01, CONTRADICTS),  # the whole interval below 0
    (0.0, -0.02, 0.0, CONTRADICTS),      # no better than the baseline / the control task
    (0.03, -0.02, 0.08, UNDECIDED),      # straddles 0
    (-0.01, -0.05, 0.02, UNDECIDED),
])
def test_each_side_of_the_threshold_and_a_straddling_interval(study, key, value, low, high, verdict):
    row = _row(study, {key: value, f"{key}_low": low, f"{key}_high": high})
    assert row["verdict"] == verdict, row
    assert row["paper"] and row["method"] and row["instrument"] and row["reason"] == ""


@pytest.mark.parametrize("study,key", [SENSES, PROBES])
def test_a_result_without_the_papers_statistic_is_not_applicable_with_the_reason(study, key):
    """An old result carries only the in-sample best-layer numbers: they are not the paper's statistic."""
    old = {"best_knn_accuracy": 0.8, "most_frequent_sense": 0.1, "best_selectivity": 0.3}
    row = _row(study, old)
    assert row["verdict"] == NOT_APPLICABLE and key in row["reason"] and "rerun" in row["reason"]


@pytest.mark.parametrize("study,key", [SENSES, PROBES])
def test_nested_values_mark_an_unstable_value(study, key):
    from studies.reporting.headlines import verdict_text

    base = {key: 0.10, f"{key}_low": 0.06, f"{key}_high": 0.14, f"nested_n__{key}": [100, 200, 400]}
    stable = _row(study, {**base, f"nested__{key}": [0.12, 0.09, 0.10]})
    assert stable["verdict"] == AGREES and stable["unstable"] is False and stable["nested_n"] == [100, 200, 400]
    drifting = _row(study, {**base, f"nested__{key}": [0.30, 0.16, 0.10]})  # moved 0.2 > the width 0.08
    assert drifting["unstable"] is True and "unstable" in verdict_text(drifting)


def test_the_senses_claim_names_the_unit_of_independence_and_the_other_instrument():
    row = _row(*SENSES[:1], {"sense_margin": 0.1, "sense_margin_low": 0.05, "sense_margin_high": 0.15})
    assert "lemma" in row["method"] and "Peters" in row["source"] and "65.9" in row["paper"]
    assert "leave-one-out" in row["instrument"]


def test_the_probes_claim_is_hewitt_and_liangs_selectivity():
    row = _row("probes", {"mean_selectivity": 0.1, "mean_selectivity_low": 0.05, "mean_selectivity_high": 0.15})
    assert "control" in row["paper"] and "Hewitt" in row["source"] and "documents" in row["method"]


# ------------------------------------------------------------------------------ senses: known answers
def test_the_layer_is_chosen_on_the_other_half_of_the_lemmas():
    from studies.senses.study import crossfit_accuracy

    # 4 lemmas, 3 layers: lemmas 0 and 1 are best at layer 2, lemmas 2 and 3 at layer 0
    acc = np.array([[0.1, 0.1, 0.9, 0.9],
                    [0.5, 0.5, 0.5, 0.5],
                    [0.9, 0.9, 0.1, 0.1]])
    sizes = np.array([4, 4, 4, 4])
    for seed in range(6):
        heldout, layers = crossfit_accuracy(acc, sizes, seed)
        first = np.zeros(4, bool)
        first[np.random.default_rng(seed).permutation(4)[:2]] = True
        for part, layer in zip((first, ~first), layers):
            w = sizes[~part]
            assert layer == int(np.argmax(acc[:, ~part] @ w / w.sum()))
            np.testing.assert_allclose(heldout[part], acc[layer, part])
    # halves that each pick the other half's best layer score below the in-sample best (0.9 everywhere)
    heldout, _ = crossfit_accuracy(acc, sizes, seed=0)
    assert heldout.mean() < acc.max(axis=0).mean()
    with pytest.raises(ValueError, match="at least 2 lemmas"):
        crossfit_accuracy(acc[:, :1], sizes[:1])


def test_the_margin_is_over_the_stronger_sense_blind_baseline_with_a_lemma_interval():
    from studies.senses.study import sense_margin

    rng = np.random.default_rng(0)
    n = rng.integers(4, 9, size=60)
    heldout = np.clip(0.55 + 0.1 * rng.standard_normal(60), 0, 1)
    chance = np.full(60, 0.4)
    mfs = np.zeros(60)              # balanced lemmas: leaving one out makes its sense the minority
    acc, margin, low, high = sense_margin(heldout, chance, mfs, n, n_boot=500, seed=1)
    assert acc == pytest.approx(float((heldout * n).sum() / n.sum()))
    assert margin == pytest.approx(acc - 0.4)          # against chance, not the degenerate MFS of 0
    assert low < margin < high and high - low < 0.1
    # the most-frequent-sense baseline, when it is the stronger one, is the comparator
    _, m2, _, _ = sense_margin(heldout, chance, np.full(60, 0.5), n, n_boot=10)
    assert m2 == pytest.approx(acc - 0.5)


def test_the_sense_null_permutes_senses_within_lemmas_at_the_chosen_layers():
    from probes.knn import KnnSenseProbe
    from studies.senses.study import Config, _judged

    rng = np.random.default_rng(0)
    n_lemmas, per = 16, 6                      # 2 senses x 3 contexts per lemma
    groups = np.repeat([f"w{i:02d}" for i in range(n_lemmas)], per)
    senses = np.array([f"{g}.{j % 2}" for g, j in zip(groups, np.tile(np.arange(per), n_lemmas))])
    code = np.array([int(s[-1]) for s in senses])
    noise = rng.standard_normal((3, len(groups), 8))
    states = noise.copy()
    states[2] += 4.0 * code[:, None] * np.eye(8)[0]     # block 1 separates the senses; the embeddings do not
    knn = KnnSenseProbe(k=1).fit(states, senses, groups).result_
    cfg = Config(n_boot=200, n_null=50)
    out = _judged(knn, cfg, states, senses, groups)
    assert out["heldout_layers"] == [1, 1] and out["sense_margin"] > 0.3
    assert out["null__sense_margin"] == pytest.approx(0.0, abs=0.08)   # chance is the null's expectation
    assert out["null_p__sense_margin"] == pytest.approx(1 / 51, abs=1e-6)
    assert out["sense_margin_low"] > 0 and len(out["nested__sense_margin"]) == 3
    assert "null__sense_margin" not in _judged(knn, Config(n_null=0), states, senses, groups)


# ------------------------------------------------------------------------------ probes: known answers
def test_mean_selectivity_is_the_out_of_fold_difference_averaged_over_layers():
    from probes.linear_probe import LinearProbe
    from studies.probes_study.study import mean_selectivity

    rng = np.random.default_rng(0)
    n, d = 240, 8
    types = rng.integers(0, 40, size=n)
    y = (types % 2).astype(int)                                   # a property of the type...
    X = np.stack([rng.standard_normal((n, d)) + y[:, None] * [1.5] + 0.1 * l for l in range(3)])  # ...written in
    groups = np.repeat(np.arange(12), n // 12)
    r = LinearProbe(kind="ridge", n_folds=4, seed=0).fit(X, y, word_types=types, groups=groups).result_
    assert r.correct.shape == (3, n) and not np.isnan(r.correct).any() and not np.isnan(r.control_correct).any()
    # every token is held out once: the out-of-fold accuracy is the token mean, near the fold mean
    np.testing.assert_allclose(r.correct.mean(axis=1), r.accuracy, atol=0.03)
    np.testing.assert_allclose(r.control_correct.mean(axis=1), r.control_accuracy, atol=0.03)
    assert mean_selectivity(r) == pytest.approx(float((r.correct - r.control_correct).mean()))
    assert mean_selectivity(r) > 0.2


def test_control_draws_average_the_control_task_and_one_draw_is_the_old_control_task(monkeypatch):
    import probes.linear_probe as lp
    from probes.linear_probe import LinearProbe
    from studies.probes_study.study import draw_selectivity, mean_selectivity, widen

    rng = np.random.default_rng(1)
    n, d = 240, 6
    types = rng.integers(0, 30, size=n)
    y = (types % 3 == 0).astype(int)
    X = np.stack([rng.standard_normal((n, d)) + y[:, None] * 1.2 for _ in range(2)])
    groups = np.repeat(np.arange(12), n // 12)
    fit = lambda k: LinearProbe(kind="ridge", n_folds=4, seed=7, n_control_draws=k).fit(  # noqa: E731
        X, y, word_types=types, groups=groups).result_
    one = fit(1)
    seeds, draw = [], lp.control_labels
    monkeypatch.setattr(lp, "control_labels", lambda yy, w, seed: seeds.append(seed) or draw(yy, w, seed))
    three = fit(3)
    assert seeds == [7, 8, 9]                                               # draw j: the control task of seed + j
    np.testing.assert_array_equal(one.accuracy, three.accuracy)          # the real task is untouched
    np.testing.assert_allclose(three.control_draw_accuracy[0], one.control_draw_accuracy[0])
    np.testing.assert_allclose(three.control_accuracy, one.control_accuracy, atol=0.5)
    np.testing.assert_allclose(three.control_correct.mean(axis=1), three.control_draw_accuracy.mean(axis=0))
    assert np.all((three.control_correct >= 0) & (three.control_correct <= 1))
    per_draw = draw_selectivity(three).mean(axis=1)
    assert per_draw.mean() == pytest.approx(mean_selectivity(three))
    # widening: unchanged with one draw; wider on each side with spread draws; never narrower
    assert widen(0.1, 0.08, 0.12, [0.1]) == (0.08, 0.12)
    lo, hi = widen(0.1, 0.08, 0.12, [0.05, 0.1, 0.15])
    z = 1.96 * 0.05 / np.sqrt(3)
    assert lo == pytest.approx(0.1 - np.hypot(0.02, z)) and hi == pytest.approx(0.1 + np.hypot(0.02, z))
    with pytest.raises(ValueError, match="n_control_draws"):
        LinearProbe(kind="ridge", n_control_draws=0).fit(X, y, word_types=types, groups=groups)


# ------------------------------------------------------------------------------ probes: end to end
@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    import lens

    path = tmp_path_factory.mktemp("store") / "tiny"
    lens.capture(lens.load_model("tiny-llama"), corpus="wiki-sample", sites=["resid_post"], layers="all",
                 max_tokens=512, seq_len=64, out=str(path), progress=False)
    return path


def test_the_probes_study_writes_the_judged_statistic_its_interval_and_nested_values(store_dir, tmp_path):
    from app.commands.cli import main
    from studies.reporting.headlines import judged
    from studies.reporting.results import read_result

    out = tmp_path / "p"
    rc = main(["study", "probes", "--model", "tiny-llama", "--store", str(store_dir), "--out", str(out), "--quiet",
               "--param", "scalar_mix=false", "--param", "n_boot=200"])
    assert rc in (0, None)
    rec = read_result(out)
    s = rec.summary
    assert "underdetermined" not in s and "train_tokens_per_dim" not in s
    assert s["mean_selectivity_low"] <= s["mean_selectivity"] <= s["mean_selectivity_high"]
    assert len(s["control_draw_selectivity"]) == 5
    assert np.mean(s["control_draw_selectivity"]) == pytest.approx(s["mean_selectivity"], abs=1e-5)
    # the out-of-fold mean is the fold-mean metric's average up to fold sizes
    assert s["mean_selectivity"] == pytest.approx(float(np.mean(rec.metrics["selectivity"])), abs=0.05)
    nested, sizes = s["nested__mean_selectivity"], s["nested_n__mean_selectivity"]
    assert len(nested) == 3 and nested[-1] == pytest.approx(s["mean_selectivity"], abs=1e-6)
    assert sizes[0] <= sizes[1] <= sizes[2] == s["n_probe_tokens"]
    lo, hi = np.asarray(rec.metrics["selectivity_low"]), np.asarray(rec.metrics["selectivity_high"])
    assert np.all(lo <= hi)
    row = judged(rec)[0]
    assert row["verdict"] in (AGREES, CONTRADICTS, UNDECIDED) and row["nested"] == nested
