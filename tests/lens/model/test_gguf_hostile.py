"""A GGUF file is held to the model-folder rules before transformers builds or dequantises anything.

Each hostile file below is written by the test factory (a real GGUF file, read by transformers' own header
reader) and must be refused as one ``LensInputError`` line naming the file and the metadata key — not built
(10^7 blocks would run unbounded in transformers' dequantisation), not an internal error — with nothing left in
the cache. A file cut short after its header, or whose header states an alignment of zero, is refused the same
way; the CLI says it in one line with exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import lens
from lens.errors import LensInputError
from lens.model.loading import smollm2_gguf_path
from tests.lens.gguf_factory import write_gguf, write_tiny_gguf

pytestmark = pytest.mark.skipif(smollm2_gguf_path() is None, reason="the tiny GGUF files borrow SmolLM2's tokenizer")

# a llama file's sizes, all within the limits: each case below breaks one
SANE = {"llama.block_count": 2, "llama.embedding_length": 64, "llama.feed_forward_length": 128,
        "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2, "llama.context_length": 256}

HOSTILE = [
    ("llama.block_count", 10 ** 7, "at most 4096"),
    ("llama.block_count", 0, "positive integer"),
    ("llama.embedding_length", 2 ** 40, "at most 16777216"),
    ("llama.vocab_size", -5, "positive integer"),
    ("llama.feed_forward_length", 2 ** 40, "at most 16777216"),
    ("llama.context_length", 2 ** 40, "at most 67108864"),
    ("llama.attention.head_count_kv", [2, 2 ** 30], "at most 16777216"),
    ("llama.attention.head_count", 1.5, "expected an integer"),
]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LENS_CACHE_DIR", str(tmp_path / "cache"))


def _cache_entries(tmp_path: Path) -> list[str]:
    models = tmp_path / "cache" / "models"
    return sorted(os.listdir(models)) if models.is_dir() else []


@pytest.mark.parametrize("key,value,expected", HOSTILE, ids=[f"{k}={str(v)[:12]}" for k, v, _ in HOSTILE])
def test_a_size_past_the_rules_is_refused_naming_file_and_key(key, value, expected, tmp_path):
    path = write_gguf(tmp_path / "hostile.gguf", "llama", {**SANE, key: value}, {}, "hostile")
    with pytest.raises(LensInputError) as err:
        lens.load_model(path)
    message = str(err.value)
    assert str(path) in message and key in message and expected in message and "\n" not in message, message
    assert _cache_entries(tmp_path) == []


def test_the_same_sizes_within_the_rules_get_past_the_check(tmp_path):
    """The control: the SANE header itself is not refused by the size check (it fails later, for having no
    tensors — transformers' own complaint, still one line)."""
    path = write_gguf(tmp_path / "sane.gguf", "llama", SANE, {}, "sane")
    with pytest.raises(LensInputError) as err:
        lens.load_model(path)
    assert "GGUF metadata" not in str(err.value) and "at most" not in str(err.value), str(err.value)


def test_sizes_that_fit_the_rules_but_not_the_memory_are_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("LENS_NO_MEMORY_CHECK", raising=False)
    meta = {**SANE, "llama.block_count": 4096, "llama.embedding_length": 1 << 24}  # 4096 * 2^48 parameters
    path = write_gguf(tmp_path / "huge.gguf", "llama", meta, {}, "huge")
    with pytest.raises(LensInputError, match=r"GGUF file .*huge\.gguf needs at least .* GiB .*--no-memory-check"):
        lens.load_model(path)
    assert _cache_entries(tmp_path) == []


def test_a_file_cut_short_after_its_header_is_refused_naming_a_tensor(tmp_path):
    tiny = write_tiny_gguf("llama", "llama", tmp_path)
    data = tiny.path.read_bytes()
    tiny.path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(LensInputError, match=r"tensor '.*' lies at bytes .* past the end of the file") as err:
        lens.load_model(tiny.path)
    assert "\n" not in str(err.value) and _cache_entries(tmp_path) == []


def test_an_alignment_of_zero_is_refused_as_a_damaged_header(tmp_path):
    path = write_gguf(tmp_path / "align.gguf", "llama", {**SANE, "general.alignment": 0}, {}, "align")
    with pytest.raises(LensInputError, match="not a readable GGUF file") as err:
        lens.load_model(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("case", ["blocks", "truncated", "empty"])
def test_cli_refuses_with_exit_2_and_one_line(case, tmp_path):
    if case == "blocks":
        path = write_gguf(tmp_path / "blocks.gguf", "llama", {**SANE, "llama.block_count": 10 ** 7}, {}, "blocks")
        expected = "llama.block_count is 10000000"
    elif case == "truncated":
        path = write_tiny_gguf("llama", "llama", tmp_path).path
        path.write_bytes(path.read_bytes()[:-1000])
        expected = "past the end of the file"
    else:
        path = tmp_path / "empty.gguf"
        path.write_bytes(b"")
        expected = "not a GGUF file"
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "LENS_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "app", "inspect", str(path)], capture_output=True, text=True,
                          env=env, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0] and str(path) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and _cache_entries(tmp_path) == []
