"""The bad-input table of issue 14: every case exits 2 with one line saying what was expected and
what came — never exit 1 ("internal error") and never a page of warnings.

Most cases run ``app.commands.cli.main`` in-process (the console script's code path minus interpreter
start-up); the unknown-hub-id case needs a fresh interpreter without ``HF_HUB_OFFLINE``, because the
23-line failure came from huggingface_hub retrying an unreachable hub.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
SMALL = ["--corpus", "lee", "--max-tokens", "200", "--quiet"]


def _files(tmp: Path) -> None:
    (tmp / "badcfg").mkdir()
    (tmp / "badcfg" / "config.json").write_text("{not json")
    (tmp / "random.gguf").write_bytes(os.urandom(4096))
    (tmp / "a-file").write_text("not a folder")


CUDA = torch.cuda.is_available()

# (id, argv with {tmp} placeholders, expected fragment of the one line)
TABLE = [
    ("config-json-not-json", ["capture", "{tmp}/badcfg", "--out", "{tmp}/x", *SMALL], "config.json is not valid JSON"),
    ("random-bytes-gguf", ["capture", "{tmp}/random.gguf", "--out", "{tmp}/x", *SMALL], "is not a GGUF file"),
    ("seq-len-0", ["capture", "tiny-llama", "--seq-len", "0", "--out", "{tmp}/x", *SMALL], "seq_len must be an integer of at least 4, got 0"),
    ("seq-len-past-positions", ["capture", "tiny-gpt2", "--seq-len", "4096", "--out", "{tmp}/x", *SMALL], "expected at most 1024"),
    ("study-seq-len-0", ["study", "linearity", "--model", "tiny-llama", "--seq-len", "0", "--out", "{tmp}/r", *SMALL], "seq_len must be"),
    ("device-bogus", ["capture", "tiny-llama", "--device", "bogus", "--out", "{tmp}/x", *SMALL], "unknown device 'bogus'"),
    ("device-cuda-index", ["capture", "tiny-llama", "--device", "cuda:99", "--out", "{tmp}/x", *SMALL], "cuda:99"),
    ("study-device-bogus", ["study", "linearity", "--model", "tiny-llama", "--device", "gpu0", "--out", "{tmp}/r", *SMALL], "unknown device 'gpu0'"),
    ("param-ridge-negative", ["study", "linearity", "--model", "tiny-llama", "--param", "ridge=-1", "--out", "{tmp}/r", *SMALL], "ridge must be >= 0"),
    ("param-not-a-number", ["study", "linearity", "--model", "tiny-llama", "--param", "ridge=lots", "--out", "{tmp}/r", *SMALL], "expected float"),
    ("out-is-a-file", ["capture", "tiny-llama", "--out", "{tmp}/a-file", *SMALL], "is not a folder"),
    ("verify-missing-store", ["store", "verify", "{tmp}/nowhere"], "store not found"),
    ("info-not-a-store", ["store", "info", "{tmp}/badcfg"], "not an activation store"),
]
if not CUDA:
    TABLE.append(("device-cuda-without-gpu", ["capture", "tiny-llama", "--device", "cuda", "--out", "{tmp}/x", *SMALL],
                  "no CUDA GPU" if torch.version.cuda else "CPU-only build"))


def _cli(capsys, argv) -> tuple[int, str]:
    from app.commands.cli import main

    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's own errors (exit 2, one line) leave through SystemExit
        rc = exc.code
    return rc, capsys.readouterr().err


def _one_line(rc: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and lines[0].startswith("lens: error:") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("case,argv,expected", TABLE, ids=[c[0] for c in TABLE])
def test_bad_input_table(case, argv, expected, tmp_path, capsys):
    _files(tmp_path)
    rc, err = _cli(capsys, [a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert expected in _one_line(rc, err)
    assert not (tmp_path / "x").exists()  # a refused capture leaves nothing behind


def test_unreadable_corpus_file(tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A readable corpus file.\n")
    if os.geteuid() == 0:  # root reads a mode-000 file anyway: make the read itself fail
        real = os.open

        def refusing_open(path, *args, **kwargs):
            if Path(path) == corpus:
                raise PermissionError(13, "Permission denied")
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", refusing_open)
    else:
        corpus.chmod(0)
    rc, err = _cli(capsys, ["capture", "tiny-llama", "--corpus", corpus, "--out", tmp_path / "x", "--quiet"])
    assert "cannot be read (Permission denied)" in _one_line(rc, err)


def test_unknown_hub_id_offline_is_one_quick_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_ENDPOINT="http://127.0.0.1:9")  # nothing listens there
    env.pop("HTTPS_PROXY", None), env.pop("https_proxy", None), env.pop("ALL_PROXY", None), env.pop("all_proxy", None)
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "app", "capture", "lens-workbench-test/no-such-model",
                          "--out", tmp_path / "x", "--quiet"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "could not load 'lens-workbench-test/no-such-model'" in out.stderr, out.stderr
    assert time.time() - t0 < 60  # no minute of retries either


@pytest.fixture(scope="module")
def nan_model_dir(tmp_path_factory):
    """tiny-llama with one infinite weight in layer 2's MLP, saved as a model folder."""
    import lens

    model = lens.load_model("tiny-llama")  # a fresh copy: the shared fixture stays intact
    with torch.no_grad():
        model.hf_model.model.layers[2].mlp.down_proj.weight[0, 0] = float("inf")
    path = tmp_path_factory.mktemp("nan-model") / "nan-llama"
    model.hf_model.save_pretrained(path)
    model.tokenizer.save_pretrained(path)
    return path


def test_non_finite_states_are_recorded_flagged_and_refused(nan_model_dir, tmp_path, capsys):
    store = tmp_path / "store"
    rc, err = _cli(capsys, ["capture", nan_model_dir, "--out", store, "--corpus", "lee", "--max-tokens", "200",
                            "--quiet"])
    assert rc == 0, err
    import lens

    counts = lens.open_store(store).nonfinite("resid_post")
    assert counts[0] == counts[1] == 0 and counts[2] > 0 and counts[3] > 0
    from app.commands.cli import main

    capsys.readouterr()
    assert main(["store", "info", str(store)]) == 0
    out = capsys.readouterr().out
    assert "NON-FINITE resid_post layers 2, 3" in out
    assert main(["store", "verify", str(store)]) == 0  # recorded counts match the data
    assert "NON-FINITE resid_post: layer 2" in capsys.readouterr().out
    for argv in (["study", "linearity", "--model", nan_model_dir, "--out", tmp_path / "r1", *SMALL],
                 ["study", "prediction-gains", "--model", nan_model_dir, "--out", tmp_path / "r2", *SMALL]):
        rc, err = _cli(capsys, argv)
        assert "non-finite values (NaN or inf) at resid_post layer 2 (and layer 3)" in _one_line(rc, err)
