"""Sample sizes that can carry a claim (studies.sample_size): the rule's known answers, the mark on a
result and on its headlines, and the refusal at the command line."""

from __future__ import annotations

import pytest

import lens
from app.cli import main
from studies.headlines import UNDERDETERMINED_MARK, headlines_for
from studies.results import read_result
from studies.sample_size import MIN_TOKENS_PER_DIM, FitSize, check_fit_size


def test_the_rule_at_its_edge():
    d = 896
    edge = int(MIN_TOKENS_PER_DIM * d)
    assert not FitSize("ridge", edge, d).underdetermined
    below = FitSize("ridge", edge - 1, d)
    assert below.underdetermined and below.needed == edge
    note = FitSize("ridge", 700, d).note()
    assert "700 training tokens for a 896-wide state" in note and "at least 3584" in note
    s = FitSize("ridge", 700, d).summary()
    assert s["underdetermined"] is True and s["train_tokens_per_dim"] == pytest.approx(700 / 896, abs=1e-4)
    assert check_fit_size("x", "ridge", 700, d, "mark").underdetermined
    with pytest.raises(lens.LensInputError, match=r"x: ridge: 700 training tokens .*raise --max-tokens"):
        check_fit_size("x", "ridge", 700, d, "refuse")
    assert not check_fit_size("x", "ridge", 5000, d, "refuse").underdetermined
    with pytest.raises(lens.LensInputError, match="fit_size: expected one of"):
        check_fit_size("x", "ridge", 5000, d, "maybe")


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "tiny"
    lens.capture(lens.load_model("tiny-llama"), corpus="wiki-sample", sites=["resid_post"], layers="all",
                 max_tokens=512, seq_len=64, out=str(path), progress=False)
    return path


def test_a_probe_on_too_few_tokens_is_marked_and_its_headlines_say_so(store_dir, tmp_path):
    """tiny-llama is 64 wide: 200 probe tokens in 5 folds train on 160 < 4 x 64."""
    out = tmp_path / "p"
    rc = main(["study", "probes", "--model", "tiny-llama", "--store", str(store_dir), "--out", str(out), "--quiet",
               "--param", "max_probe_tokens=200", "--param", "scalar_mix=false"])
    assert rc in (0, None)
    rec = read_result(out)
    assert rec.summary["underdetermined"] is True and rec.summary["train_tokens_per_dim"] < MIN_TOKENS_PER_DIM
    rows = [r for r in headlines_for(rec) if r["value"] is not None]
    assert rows and all(r["underdetermined"] and UNDERDETERMINED_MARK in r["text"] for r in rows)


def test_refuse_turns_an_underdetermined_fit_into_exit_2(store_dir, tmp_path, capsys):
    rc = main(["study", "probes", "--model", "tiny-llama", "--store", str(store_dir), "--out", str(tmp_path / "p"),
               "--quiet", "--param", "max_probe_tokens=200", "--param", "scalar_mix=false",
               "--param", "fit_size=refuse"])
    err = capsys.readouterr().err
    assert rc == 2 and "underdetermined" in err and "raise --max-tokens" in err
    assert not (tmp_path / "p" / "result.json").exists()


def test_enough_tokens_are_not_marked(store_dir, tmp_path):
    out = tmp_path / "pg"
    rc = main(["study", "prediction-gains", "--model", "tiny-llama", "--store", str(store_dir), "--out", str(out),
               "--quiet", "--param", "logit_lens=false", "--param", "n_boot=20", "--param", "split_by=window",
               "--param", "fit_size=refuse"])
    assert rc in (0, None)
    rec = read_result(out)
    assert rec.summary["underdetermined"] is False
    assert rec.summary["train_tokens_per_dim"] == pytest.approx(rec.summary["n_train_tokens"] / 64, abs=1e-3)
