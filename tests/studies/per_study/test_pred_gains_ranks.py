"""Prediction gains' judged fit (He & Su's recipe, per-group sums and Grams) over a store's shards by N processes
(issue #40): two ranks, each reading its own shards and adding its sums to the other's, equal one process — in
threads with an in-memory sum, and under a real torchrun (``python -m torch.distributed.run``, gloo on the CPU).

Bound: the sums are float64 and are only added in another order, so PR per layer agrees to 1e-9 relative and
Pearson r, its interval and the nested values to 1e-9 absolute (seen on tiny-llama: PR 2e-16 relative, r 1e-14)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, tiny_llama):
    import lens

    out = tmp_path_factory.mktemp("pg-ranks") / "store"
    lens.capture(tiny_llama, "wiki-sample", max_tokens=800, seq_len=32, shard_tokens=256, out=out, progress=False)
    store = lens.open_store(out)
    assert len(store.manifest["shards"]) >= 3
    return out, store


def _assert_same(a, b):
    np.testing.assert_allclose(a.pr, b.pr, rtol=1e-9)
    assert abs(a.summary.pearson_r - b.summary.pearson_r) < 1e-9
    np.testing.assert_allclose(a.pearson_interval, b.pearson_interval, atol=1e-9)
    np.testing.assert_allclose(np.asarray(a.nested_r, float), np.asarray(b.nested_r, float), atol=1e-9)
    assert a.n_tokens == b.n_tokens and a.n_groups == b.n_groups and list(a.nested_n) == list(b.nested_n)


def test_shards_are_dealt_to_ranks_disjoint_and_whole(sharded):
    from studies.prediction_gains.ranks import shard_rows

    _, store = sharded
    masks = [shard_rows(store.manifest, r, 2) for r in range(2)]
    assert (masks[0] ^ masks[1]).all() and masks[0].sum() and masks[1].sum()
    assert shard_rows(store.manifest, 0, 1).all()


def test_two_shares_summed_in_threads_equal_one_process(sharded):
    from probes.token_id_pr import RowShare
    from studies.prediction_gains.ranks import fit, shard_rows
    from studies.prediction_gains.study import Config

    _, store = sharded
    config = Config(jackknife_groups=5, progress=False)
    single = fit(config, store)
    barrier, slots, results = threading.Barrier(2), [None, None], [None, None]

    def reducer(rank):
        def reduce(a):
            slots[rank] = a.copy()
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()  # both have read the slots before the next layer overwrites them
            return total
        return reduce

    def run(rank):
        results[rank] = fit(config, store, RowShare(shard_rows(store.manifest, rank, 2), reducer(rank)))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for r in results:
        _assert_same(r, single)


def test_torchrun_two_ranks_equal_one_process(sharded, tmp_path):
    from studies.prediction_gains.ranks import fit, result_record
    from studies.prediction_gains.study import Config

    path, store = sharded
    out = tmp_path / "ranks.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LENS_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "studies.prediction_gains.ranks", "--store", str(path), "--out", str(out), "--jackknife-groups", "5"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    want = result_record(fit(Config(jackknife_groups=5, progress=False), store), 1)
    assert got["world_size"] == 2 and got["n_tokens"] == want["n_tokens"]
    np.testing.assert_allclose(got["pr_token_id"], want["pr_token_id"], rtol=1e-9)
    for key in ("pearson_r_token_id", "pearson_r_token_id_low", "pearson_r_token_id_high"):
        assert abs(got[key] - want[key]) < 1e-9
    np.testing.assert_allclose(got["nested_r"], want["nested_r"], atol=1e-9)


def test_a_missing_store_is_one_line_and_exit_2(tmp_path, capsys):
    from studies.prediction_gains.ranks import main

    assert main(["--store", str(tmp_path / "nope"), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lens: error: --store: no store at")
    assert not (tmp_path / "r.json").exists()
