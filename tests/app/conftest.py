"""Results the explorer's tests read: two fast studies run on tiny-llama (300 tokens) through the main
job, plus synthetic results folders (tests/synthetic_runs.py) for the studies that are slow or not there yet."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# the packages, imported before any page script runs: streamlit.testing puts a page's folder (app/explorer/views,
# which holds geometry.py and studies.py) first on sys.path, and a later `import geometry` inside the
# app (app/explorer/nearest.py) would find the page instead when no earlier test had imported the package
import geometry  # noqa: E402,F401
import studies.core.registry  # noqa: E402,F401

FAST_STUDIES = "prediction-gains,linearity"


@pytest.fixture(scope="session")
def results_root(tmp_path_factory) -> Path:
    from tests.synthetic_runs import write_synthetic_run
    from studies.job.main_job import run_all

    os.environ["LENS_HTML_CDN"] = "1"  # figure.html files link plotly.js instead of inlining 4 MB each
    root = tmp_path_factory.mktemp("results")
    base = {"model": "tiny-llama", "corpus": "wiki-sample", "max_tokens": 300, "seq_len": 128, "batch_size": 8,
            "device": "cpu", "store": None, "seed": 0, "progress": False}
    run_all(base, root / "tiny", only=FAST_STUDIES, progress=False)
    write_synthetic_run(root / "synth", n_layers=6, n_tokens=200)
    write_synthetic_run(root / "synth-b", model="synthetic-8l", n_layers=8, n_tokens=200, seed=1)
    return root


@pytest.fixture()
def app_env(results_root, monkeypatch):
    monkeypatch.setenv("LENS_APP_RESULTS", str(results_root))
    monkeypatch.setenv("LENS_APP_STORES", str(results_root / "tiny"))
    return results_root

