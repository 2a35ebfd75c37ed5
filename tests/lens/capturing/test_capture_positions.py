"""Selective capture: ``--positions`` keeps some positions of each window, and nothing else changes.

A thinned store holds exactly the full store's rows at those positions (states and token table), the
manifest says which positions; it resumes, splits into parts and merges byte for byte like a full
one; and the studies that need every position refuse it by name.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import lens
import lens.text.corpora
from lens.capturing.capture import keep_positions
from lens.errors import LensInputError, StoreWriteError
from lens.store.positions import keep_mask, parse_positions, positions_label, select_positions
from lens.store import faults
from tests.lens.store_harness import assert_same_store, drop_merge_fidelity, store_files

# uneven on purpose: 3 windows a batch, shards of 2 batches, the last shard and batch cut short
KW = dict(corpus="lee", max_tokens=500, seq_len=32, batch_size=3, shard_tokens=192, sites=["resid_post", "embed"],
          progress=False)


def _cli(argv, capsys, stream: str = "err") -> tuple[int, str]:
    from app.commands.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in argv])
    return rc, getattr(capsys.readouterr(), stream)


@pytest.fixture(scope="module")
def full(tiny_llama, tmp_path_factory):
    return lens.capture(tiny_llama, out=tmp_path_factory.mktemp("full") / "s", **KW)


def test_the_vocabulary():
    assert parse_positions("every:4") == "every:4" and parse_positions(" First: 2 ") == "first:2"
    assert parse_positions("last") == (-1,) and parse_positions("0,5,-1") == (0, 5, -1)
    assert [positions_label(p) for p in ("all", "last", [-1], "every:3", "first:1", "0, 5,-1")] == \
        ["all", "last", "last", "every:3", "first:1", "0,5,-1"]
    for bad in ("every:0", "every:x", "first:-2", "first:", "every"):
        with pytest.raises(LensInputError, match="positions"):
            parse_positions(bad)
    # counted among each sequence's real tokens, padding on either side skipped
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0]])
    every = select_positions(mask, "every:2")
    assert every.seq.tolist() == [0, 0, 0, 1, 1] and every.pos.tolist() == [0, 2, 4, 0, 2]
    assert every.index.tolist() == [2, 4, 6, 7, 9]
    first = select_positions(mask, "first:4")
    assert first.pos.tolist() == [0, 1, 2, 3, 0, 1, 2]
    rank = np.arange(6)
    assert keep_mask(rank, 6, "every:5").tolist() == [True, False, False, False, False, True]
    assert keep_mask(rank, 6, (0, -2)).tolist() == [True, False, False, False, True, False]


@pytest.mark.parametrize("positions", ["every:3", "first:5", "0,7,-1", "last"])
def test_a_thinned_store_holds_the_full_stores_rows_at_those_positions(tiny_llama, full, tmp_path, positions):
    thin = lens.capture(tiny_llama, out=tmp_path / "t", positions=positions, **KW)
    tok = {k: np.asarray(v) for k, v in full.tokens.items()}
    window_len = np.bincount(tok["window"])[tok["window"]]
    rows = np.flatnonzero(keep_mask(tok["pos"], window_len, positions))
    assert thin.manifest["positions"] == positions_label(positions) == thin.manifest["settings"]["positions"]
    assert thin.n_tokens == len(rows) < full.n_tokens and thin.manifest["n_tokens_planned"] == len(rows)
    for col in full.tokens:
        assert np.array_equal(np.asarray(thin.tokens[col]), tok[col][rows]), col
    if positions == "last":
        assert (tok["pos"][rows] == window_len[rows] - 1).all() and len(rows) == len(np.unique(tok["window"]))
    for layer in full.layers("resid_post"):
        assert torch.equal(thin.get(layer=layer), full.get(layer=layer)[rows])
    assert torch.equal(thin.get(site="embed"), full.get(site="embed")[rows])
    # in memory, the same rows
    mem = lens.capture(tiny_llama, positions=positions, **KW)
    assert mem.n_tokens == len(rows) and torch.equal(mem.get(layer=1), full.get(layer=1)[rows])


def test_serial_and_pipelined_thinned_captures_are_byte_identical(tiny_llama, tmp_path):
    lens.capture(tiny_llama, out=tmp_path / "serial", positions="every:4", pipeline=False, **KW)
    lens.capture(tiny_llama, out=tmp_path / "piped", positions="every:4", **KW)
    assert_same_store(tmp_path / "piped", tmp_path / "serial")


def test_a_thinned_capture_resumes_byte_exactly_and_only_as_itself(tiny_llama, tmp_path):
    faults.reset()
    import os

    os.environ[faults.ENV] = "shard.begin@2=enospc"
    try:
        with pytest.raises(StoreWriteError, match="--resume"):
            lens.capture(tiny_llama, out=tmp_path / "s", positions="every:2", **KW)
    finally:
        del os.environ[faults.ENV]
        faults.reset()
    done = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert len(done["shards"]) == 1 and not done["complete"]
    with pytest.raises(LensInputError, match="positions: store has 'every:2', this run has 'every:3'"):
        lens.capture(tiny_llama, out=tmp_path / "s", positions="every:3", resume=True, **KW)
    with pytest.raises(LensInputError, match="positions"):
        lens.capture(tiny_llama, out=tmp_path / "s", resume=True, **KW)  # all positions is another capture too
    lens.capture(tiny_llama, out=tmp_path / "s", positions="every:2", resume=True, **KW)
    lens.capture(tiny_llama, out=tmp_path / "ref", positions="every:2", **KW)
    assert_same_store(tmp_path / "s", tmp_path / "ref")


def test_thinned_parts_merge_into_the_single_thinned_capture(tiny_llama, tmp_path):
    from lens.store.parts import merge_stores

    lens.capture(tiny_llama, out=tmp_path / "single", positions="first:6", **KW)
    for i in (1, 2):
        lens.capture(tiny_llama, out=tmp_path / f"p{i}", positions="first:6", part=f"{i}/2", **KW)
    merge_stores([tmp_path / "p2", tmp_path / "p1"], tmp_path / "m")
    a, b = store_files(tmp_path / "m"), store_files(tmp_path / "single")
    assert sorted(a) == sorted(b)
    for name in a:
        if name != "manifest.json":
            assert a[name] == b[name], name
    ma, mb = json.loads(a["manifest.json"]), json.loads(b["manifest.json"])
    ma.pop("merged_from")
    drop_merge_fidelity(ma, mb)
    for m in (ma, mb):
        m.pop("created"), m.pop("manifest_sha256")
    assert ma == mb and ma["positions"] == "first:6"


def test_a_shard_may_keep_no_row_and_a_capture_that_keeps_none_is_refused(tiny_llama, tmp_path):
    kw = {**KW, "batch_size": 1, "shard_tokens": 32}  # one window a shard
    win = lens.text.corpora.make_windows(lens.load_corpus("lee"), tiny_llama.tokenizer, seq_len=32, max_tokens=500)
    short = [len(w) for w in win.input_ids if len(w) <= 29]
    assert short, "the corpus has no window shorter than 30 tokens: choose another position"
    store = lens.capture(tiny_llama, out=tmp_path / "s", positions="29", **kw)
    counts = [s["n_tokens"] for s in store.manifest["shards"]]
    assert 0 in counts and store.n_tokens == sum(counts) == len(win.input_ids) - len(short)
    assert lens.open_store(tmp_path / "s").get(layer=2).shape == (store.n_tokens, tiny_llama.d_model)
    from lens.store.verify import verify_store

    assert verify_store(tmp_path / "s").ok
    with pytest.raises(LensInputError, match="--positions 40 keeps no token"):
        lens.capture(tiny_llama, out=tmp_path / "none", positions="40", **kw)
    assert not (tmp_path / "none").exists()


def test_keep_positions_counts_offsets_per_window(tiny_llama):
    win = lens.text.corpora.make_windows(lens.load_corpus("lee"), tiny_llama.tokenizer, seq_len=16, max_tokens=200)
    kept, rows = keep_positions(win, "every:5")
    lengths = np.array([len(w) for w in win.input_ids])
    assert np.array_equal(np.diff(kept.window_offsets()), (lengths + 4) // 5)
    assert (np.asarray(kept.rows["pos"]) % 5 == 0).all() and kept.n_tokens == len(rows)


def test_cli_capture_with_positions_and_the_studies_that_refuse_it(tmp_path, capsys):
    out = tmp_path / "s"
    rc, err = _cli(["capture", "tiny-llama", "--corpus", "lee", "--max-tokens", "400", "--seq-len", "32",
                    "--positions", "every:4", "--out", out, "--quiet"], capsys, "out")
    assert rc == 0, err
    assert [l for l in err.splitlines() if "site-layers" in l and "free there" in l], err  # the size line, on stdout
    assert json.loads((out / "manifest.json").read_text())["positions"] == "every:4"
    rc, err = _cli(["capture", "tiny-llama", "--positions", "every:zero", "--out", tmp_path / "bad", "--quiet"],
                   capsys)
    assert rc == 2 and "every:K with K a positive integer" in err and not (tmp_path / "bad").exists()
    for study in ("logit-lens", "prediction-gains", "context-memory", "layer-ablation"):
        rc, err = _cli(["study", study, "--model", "tiny-llama", "--corpus", "lee", "--store", out,
                        "--out", tmp_path / study, "--quiet"], capsys)
        lines = [l for l in err.splitlines() if l.startswith("lens: error:")]
        assert rc == 2 and len(lines) == 1, err
        assert f"{study} needs every position of each window" in lines[0] and "keeps positions 'every:4'" in lines[0]
    # a study that reads any rows runs on it, and its result says which positions it read
    rc, err = _cli(["study", "linearity", "--model", "tiny-llama", "--corpus", "lee", "--store", out,
                    "--out", tmp_path / "linearity", "--quiet"], capsys)
    assert rc == 0, err
    result = json.loads((tmp_path / "linearity" / "result.json").read_text())
    assert result["extra"]["store_positions"] == "every:4" and result["n_tokens"] <= 100
