"""The pipelined capture writes the same bytes as the serial one, and fails the same way.

Crash safety under the pipeline (kill -9 at every protocol step, random kills, full disks, then
``--resume``) is tested by tests/lens/store/test_store_faults.py, which runs the default (pipelined) capture.
The CUDA side-stream copies cannot run here: scripts/gpu_check.sh runs tests/gpu on a GPU machine.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import lens
from lens.errors import StoreWriteError
from lens.capturing.pipeline import WriterThread, to_storage_serial
from lens.store import faults
from lens.store.format import to_storage_counted
from tests.lens.store_harness import assert_same_store

# uneven on purpose: 3 windows a batch, shards of 2 batches, a last shard and a last batch cut short
KW = dict(corpus="lee", max_tokens=420, seq_len=32, batch_size=3, shard_tokens=192,
          sites=["resid_post", "embed", "attn_out"], progress=False)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_pipelined_store_is_byte_identical_to_the_serial_one(dtype, tiny_llama, tmp_path):
    serial = lens.capture(tiny_llama, out=tmp_path / "serial", dtype=dtype, pipeline=False, **KW)
    piped = lens.capture(tiny_llama, out=tmp_path / "piped", dtype=dtype, pipeline=True, **KW)
    assert len(serial.manifest["shards"]) >= 3 and serial.n_tokens == piped.n_tokens
    assert_same_store(tmp_path / "piped", tmp_path / "serial")
    if dtype == "bfloat16":  # the in-memory capture is pipelined too (feeder, gather without a sync)
        memory = lens.capture(tiny_llama, dtype=dtype, **KW)
        for layer in range(tiny_llama.n_layers):
            assert torch.equal(memory.get(layer=layer), piped.get(layer=layer))


def test_a_part_and_a_resume_are_pipelined_too(tiny_llama, tmp_path):
    lens.capture(tiny_llama, out=tmp_path / "serial", part="2/3", pipeline=False, **KW)
    lens.capture(tiny_llama, out=tmp_path / "piped", part="2/3", **KW)
    assert_same_store(tmp_path / "piped", tmp_path / "serial")


def test_a_write_error_in_the_writer_thread_ends_the_capture_cleanly(tiny_llama, tmp_path, monkeypatch):
    before = threading.active_count()
    faults.reset()
    monkeypatch.setenv(faults.ENV, "write@7=enospc")
    with pytest.raises(StoreWriteError, match="disk is full.*--resume"):
        lens.capture(tiny_llama, out=tmp_path / "s", **KW)
    monkeypatch.delenv(faults.ENV)
    faults.reset()
    assert threading.active_count() == before  # feeder, writer and token-text threads all ended
    assert not list((tmp_path / "s" / "shards").glob("*.partial"))  # the shard being written was removed
    lens.capture(tiny_llama, out=tmp_path / "s", resume=True, **KW)
    lens.capture(tiny_llama, out=tmp_path / "ref", pipeline=False, **KW)
    assert_same_store(tmp_path / "s", tmp_path / "ref")


def test_writer_thread_runs_in_order_and_stops_at_the_first_error():
    done, cleaned = [], []
    jobs = WriterThread(depth=2)
    jobs.submit(lambda: done.append(1))
    jobs.submit(lambda: (_ for _ in ()).throw(OSError(28, "full")), lambda: cleaned.append(2))
    jobs.submit(lambda: done.append(3), lambda: cleaned.append(3))
    jobs.close()
    assert done == [1] and cleaned == [2, 3]
    with pytest.raises(OSError, match="full"):
        jobs.raise_error()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_chunked_cast_equals_the_serial_cast(dtype):
    x = torch.randn(3000, 48) * 30000
    x[5, 3], x[700, 0], x[2999, 47] = float("nan"), float("inf"), -float("inf")
    got, want = to_storage_serial(x, dtype), to_storage_counted(x, dtype)
    assert got[1] == want[1] and got[0].dtype == want[0].dtype
    assert np.array_equal(got[0].view(np.uint8), want[0].view(np.uint8))
