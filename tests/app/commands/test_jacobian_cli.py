"""``lens jlens fit / merge``: two parts merged and two torchrun ranks equal the single fit; bad files and parts
fitted with other settings refused in one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from app.commands.cli import main
from lens.readout.jacobian_lens import JacobianSums

ROOT = Path(__file__).resolve().parents[3]
FIT = ["jlens", "fit", "tiny-llama", "--corpus", "lee", "--prompts", "4", "--seq-len", "24", "--skip-first", "4",
       "--dim-batch", "32", "--quiet"]


def _ok(*argv):
    assert main([str(a) for a in argv]) == 0


def _refused(capsys, *argv) -> str:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lens: error:"), err
    return err[0]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("jl")
    _ok(*FIT, "--out", d / "whole.safetensors")
    for i in (1, 2):
        _ok(*FIT, "--part", f"{i}/2", "--out", d / f"p{i}.safetensors")
    return d


def test_two_parts_merged_equal_the_single_fit(fitted, capsys):
    _ok("jlens", "merge", fitted / "p2.safetensors", fitted / "p1.safetensors", "--out", fitted / "m.safetensors")
    whole, merged = (JacobianSums.load(fitted / f) for f in ("whole.safetensors", "m.safetensors"))
    assert merged.n_prompts == whole.n_prompts == 4 and sorted(merged.digests) == sorted(whole.digests)
    # the same per-prompt float64 estimators, summed in another order
    assert (merged.sums - whole.sums).abs().max() <= 1e-12 * whole.sums.abs().max()
    assert "missing" in _refused(capsys, "jlens", "merge", fitted / "p1.safetensors", "--out", fitted / "x.safetensors")


def test_bad_parts_and_files_are_refused(fitted, tmp_path, capsys):
    _ok(*FIT[:-3], "--dim-batch", "32", "--skip-first", "5", "--quiet", "--part", "2/2", "--out",
        tmp_path / "other.safetensors")
    line = _refused(capsys, "jlens", "merge", fitted / "p1.safetensors", tmp_path / "other.safetensors",
                    "--out", tmp_path / "m.safetensors")
    assert "other settings" in line and "skip_first=4 vs 5" in line
    data = (fitted / "p1.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-100])
    assert "truncated" in _refused(capsys, "jlens", "merge", tmp_path / "cut.safetensors", "--out", tmp_path / "m")
    torch.save({"J": {0: torch.eye(4)}}, tmp_path / "lens.pt")
    assert "pickled" in _refused(capsys, "jlens", "merge", tmp_path / "lens.pt", "--out", tmp_path / "m")
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.safetensors").exists()


@pytest.mark.slow
def test_two_torchrun_ranks_equal_the_single_fit(fitted, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LENS_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "lens",
           *FIT, "--out", tmp_path / "tr.safetensors"]
    out = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    whole, ranks = (JacobianSums.load(p) for p in (fitted / "whole.safetensors", tmp_path / "tr.safetensors"))
    assert ranks.n_prompts == 4 and ranks.digests == whole.digests and ranks.parts == []
    # float32 gradients in other processes (their BLAS threads may differ), summed in float64 by gloo
    assert (ranks.sums - whole.sums).abs().max() <= 1e-6 * whole.sums.abs().max()


def test_a_slurm_array_writes_part_files_that_merge_to_the_single_fit(fitted, tmp_path, monkeypatch):
    out = tmp_path / "lens.safetensors"
    for task in (0, 1):
        for k, v in {"SLURM_ARRAY_TASK_ID": task, "SLURM_ARRAY_TASK_COUNT": 2, "SLURM_ARRAY_TASK_MIN": 0}.items():
            monkeypatch.setenv(k, str(v))
        _ok(*FIT, "--out", out)
    parts = sorted((tmp_path / "lens.safetensors.parts").glob("part-*-of-2.safetensors"))
    assert [p.name for p in parts] == ["part-1-of-2.safetensors", "part-2-of-2.safetensors"] and not out.exists()
    _ok("jlens", "merge", *parts, "--out", out)
    whole, merged = JacobianSums.load(fitted / "whole.safetensors"), JacobianSums.load(out)
    assert (merged.sums - whole.sums).abs().max() <= 1e-12 * whole.sums.abs().max()
