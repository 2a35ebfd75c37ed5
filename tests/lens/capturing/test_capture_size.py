"""The size of a capture is known before it starts, and a capture its disk cannot hold is refused.

The estimate (lens.capturing.size) is compared with the bytes the capture actually wrote (every file of
the store folder); the refusal is tested with the free-space test hook LENS_FREE_SPACE_BYTES and, where
this runs as root, on a real 1 MiB tmpfs.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lens
from lens.capturing.size import FREE_SPACE_ENV, NotEnoughSpace

KW = dict(corpus="lee", max_tokens=900, seq_len=32, batch_size=4, shard_tokens=256, progress=False)


def _written(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def size_lines():
    """The size lines lens.capturing.capture logs (its own handler: the CLI may have stopped propagation)."""
    log, handler = logging.getLogger("lens.capturing.capture.size"), _Lines()
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield handler.lines
    log.removeHandler(handler)
    log.setLevel(level)


@pytest.mark.parametrize("dtype,sites,positions", [
    ("float32", ["resid_post"], "all"),
    ("bfloat16", ["resid_post", "embed", "attn_out"], "all"),
    ("float16", ["resid_post", "mlp_out"], "every:3"),
])
def test_the_estimate_is_within_one_percent_of_the_bytes_written(tiny_llama, tmp_path, size_lines, dtype, sites,
                                                                   positions):
    out = tmp_path / "s"
    store = lens.capture(tiny_llama, out=out, dtype=dtype, sites=sites, positions=positions, **KW)
    written = _written(out)
    assert len(size_lines) == 1, size_lines
    line = size_lines[0]
    assert f"{store.n_tokens} tokens" in line and str(out) in line and "free there" in line
    # the estimate logged before the first shard, against every byte now in the folder
    estimate = int(re.search(r" = (\d+) bytes \(", line).group(1))
    assert abs(estimate - written) <= 0.01 * written, (estimate, written)
    m = store.manifest
    assert len(m["shards"]) > 1


def test_a_capture_that_cannot_fit_is_refused_before_it_starts(tiny_llama, tmp_path, monkeypatch):
    out = tmp_path / "deep" / "store"
    monkeypatch.setenv(FREE_SPACE_ENV, "100000")  # the store needs ~1 MB
    with pytest.raises(NotEnoughSpace, match=r"would write 1\.\d MB but its filesystem has 100\.0 kB free"):
        lens.capture(tiny_llama, out=out, **KW)
    assert not out.exists()  # nothing left behind
    # the override: the same capture runs (the real disk has room)
    store = lens.capture(tiny_llama, out=out, check_space=False, **KW)
    assert store.complete


def test_a_resume_needs_room_only_for_what_is_left(tiny_llama, tmp_path, monkeypatch):
    out = tmp_path / "s"
    full = lens.capture(tiny_llama, out=tmp_path / "ref", **KW)
    total = _written(tmp_path / "ref")
    # a capture stopped by a full disk after its first shard (an injected ENOSPC at the second shard)
    from lens.errors import StoreWriteError
    from lens.store import faults

    faults.reset()
    monkeypatch.setenv(faults.ENV, "shard.begin@2=enospc")
    with pytest.raises(StoreWriteError, match="--resume"):
        lens.capture(tiny_llama, out=out, **KW)
    monkeypatch.delenv(faults.ENV)
    faults.reset()
    done = _written(out)
    assert 0 < done < total
    # room for the rest but not for the whole store: the resume goes on
    monkeypatch.setenv(FREE_SPACE_ENV, str(total - done + (total // 4)))
    resumed = lens.capture(tiny_llama, out=out, resume=True, **KW)
    assert resumed.manifest["shards"] == full.manifest["shards"]


def test_cli_prints_the_size_and_exits_2_when_it_cannot_fit(tmp_path, capsys, monkeypatch):
    from app.commands.cli import main

    monkeypatch.setenv(FREE_SPACE_ENV, "5000")
    argv = ["capture", "tiny-llama", "--corpus", "lee", "--max-tokens", "300", "--seq-len", "32",
            "--out", str(tmp_path / "s"), "--quiet"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lens: error:") and "5.0 kB free" in err[0], err
    assert "--no-space-check" in err[0]
    assert not (tmp_path / "s").exists()
    assert main(argv + ["--no-space-check"]) == 0
    out = capsys.readouterr().out
    shown = [l for l in out.splitlines() if "site-layers" in l]
    assert len(shown) == 1 and shown[0].startswith("capture into") and "not enough" in shown[0], out
    estimate, written = int(re.search(r" = (\d+) bytes \(", shown[0]).group(1)), _written(tmp_path / "s")
    assert abs(estimate - written) <= 0.01 * written, (estimate, written)


@pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux", reason="mounting a tmpfs needs root on Linux")
def test_a_small_tmpfs_refuses_the_capture(tiny_llama, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(NotEnoughSpace, match="filesystem has"):
            lens.capture(tiny_llama, out=mnt / "store", **KW)
        assert not (mnt / "store").exists()
        small = lens.capture(tiny_llama, out=mnt / "small", positions="last", **KW)  # thinned, it fits
        assert small.complete
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
