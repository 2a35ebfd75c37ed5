"""mypy over the typed joints (issue #41): the study contract (studies/core/contract.py) and the capture spec
(lens/capturing/spec.py) with the backend protocol, and their callers that are typed through. The settings are
pyproject.toml's [tool.mypy]; the large libraries are skipped so that the check stays a few seconds.
A file joins TYPED_FILES once mypy is clean on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TYPED_FILES = (
    "studies/core/contract.py",
    "studies/core/claims.py",  # the contract's judged claims (cut out of contract.py)
    "studies/core/axis.py",  # the typed layer axis (cut out of contract.py)
    "studies/core/registry.py",
    "studies/core/runner.py",
    "studies/reporting/headlines.py",
    "lens/capturing/spec.py",
    "lens/capturing/settings.py",  # the settings' parts and their plans (ModelSettings.resolve: "auto")
    "lens/capturing/capture.py",
    "lens/store/manifest.py",  # the manifest as a value (from_dict / to_dict)
    "lens/store/writer.py",  # the manifest's writers, holding the value (Manifest.first / with_shard / sealed)
    "lens/store/parts.py",
    "lens/store/exchange/importer.py",
    "lens/capturing/manifest.py",
    "lens/capturing/size.py",
    "lens/runtime/frozen_json.py",
    "studies/reporting/result_file.py",  # result.json as a value
    "studies/job/rows.py",  # main_job.json as a value (MainJobRecord)
    "lens/capturing/collect.py",
    "lens/capturing/backends/protocol.py",
    "lens/capturing/backends/__init__.py",
)


def test_the_typed_joints_pass_mypy(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "mypy-cache"), *TYPED_FILES],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
