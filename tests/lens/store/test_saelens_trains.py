"""SAELens itself trains on tiny-llama's store exported with ``lens store export --to saelens``, offline on CPU, and its
ActivationsStore yields the store's values.

sae-lens 6.54.12 (installed by ``make setup`` with ``--no-deps``: it pins transformer-lens < 4) runs in a process of
its own, tests/lens/store/saelens_consumer.py, which says which TransformerLens 3 names it gives SAELens' imports and
why none of them is used on the cached-activations path."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lens
from lens.store.exchange.saelens import whole_windows
from tests.lens.store.exchange_helpers import cli, make_store

CONSUMER = Path(__file__).with_name("saelens_consumer.py")


@pytest.mark.slow
def test_saelens_trains_on_our_export_and_reads_our_values(tiny_llama, tmp_path, capsys):
    assert importlib.util.find_spec("sae_lens"), "sae-lens is not installed: `make setup` installs it (--no-deps)"
    src = make_store(tiny_llama, tmp_path / "s", "bfloat16")
    rc, _, err = cli(["store", "export", src, "--to", "saelens", "--out", tmp_path / "c", "--quiet"], capsys)
    assert rc == 0, err
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(CONSUMER), str(tmp_path / "c" / "resid_post.2"),
                          "blocks.2.hook_resid_post", str(tmp_path / "got")], env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "got.json").read_text())
    assert report["sae_lens"] == "6.54.12" and report["w_enc_moved"] > 0 and report["weights_finite"]

    store = lens.open_store(src)
    ctx = store.manifest["settings"]["seq_len"]
    starts, _ = whole_windows(store.tokens, ctx)
    rows = (starts[:, None] + np.arange(ctx)).reshape(-1)
    ours = store.get("resid_post", 2, rows=rows).float().numpy()  # bfloat16, widened exactly by the export
    acts, ids = np.load(tmp_path / "got_acts.npy"), np.load(tmp_path / "got_ids.npy")
    assert acts.dtype == np.float32 and np.array_equal(acts, ours)  # every row, in order, bit for bit
    assert np.array_equal(ids, store.tokens["token_id"][rows])
    mixed = np.load(tmp_path / "got_mixed.npy")  # a shuffled training batch: each row one of ours
    known = {r.tobytes() for r in ours}
    assert mixed.shape == (64, store.d_model) and all(r.tobytes() in known for r in mixed)
