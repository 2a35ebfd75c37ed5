"""The studies end to end on one tiny model of each kind of block: a sandwich-norm decoder (Gemma 2),
a parallel-residual decoder (GPT-NeoX), a mixture of experts (Mixtral), a state-space model (Mamba)
and an encoder (RoBERTa) — each saved with ``save_pretrained`` to a folder, as a researcher brings it,
and run through the command line a researcher types.

The studies that need a causal LM head are not applicable to the encoder: the main job records them
as ``n/a`` with the reason and exits 0; run alone they are bad input (exit 2).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.lens.families import ONE_OF_EACH

pytestmark = pytest.mark.families

STUDIES = ("prediction-gains", "logit-lens", "linearity", "anisotropy")
CAUSAL_ONLY = {"prediction-gains", "logit-lens"}


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    from lens.model.tiny import build_tiny

    root = tmp_path_factory.mktemp("family-models")
    out = {}
    for kind, model_type in ONE_OF_EACH.items():
        model, tok = build_tiny(model_type)
        folder = root / model_type
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        out[kind] = folder
    return out


@pytest.mark.parametrize("kind", list(ONE_OF_EACH))
def test_main_job_runs_on_each_kind(kind, saved_models, tmp_path, capsys):
    from app.commands.cli import main

    folder = saved_models[kind]
    out = tmp_path / "results"
    rc = main(["study", "all", "--model", str(folder), "--max-tokens", "300", "--seq-len", "64",
               "--only", ",".join(STUDIES), "--out", str(out), "--quiet"])
    job = json.loads((out / "main_job.json").read_text())
    rows = {r["study"]: r for r in job["studies"]}
    assert rc == 0, {n: r["error"] for n, r in rows.items()}
    assert set(rows) == set(STUDIES)
    encoder = kind == "encoder"
    for name, row in rows.items():
        if encoder and name in CAUSAL_ONLY:
            assert row["status"] == "n/a", row
            assert "not a causal language model" in row["error"] or "no usable language-model head" in row["error"]
        else:
            assert row["status"] == "ok", row
    assert (out / "report.html").is_file()
    store = json.loads((out / "store" / "manifest.json").read_text())
    n_layers = store["model"]["n_layers"]

    from studies.reporting.results import read_result

    lin = read_result(out / "linearity")
    assert len(lin.metric("linearity")) == n_layers - 1  # transitions l -> l+1
    assert np.all(np.isfinite(lin.metric("linearity")))
    if not encoder:
        ll = read_result(out / "logit-lens")
        ce = np.asarray(ll.metric("ce"), dtype=float)
        assert ce.shape == (n_layers,) and np.all(np.isfinite(ce))
        assert abs(ll.metric("kl_to_final")[-1]) < 1e-4  # the last layer's lens is the model's own output
