"""A store held on a device keeps every read there, and the logit lens copies to the host once, at the end.

No CUDA here: the "meta" device stands in for a GPU (a tensor that leaves it for the host would have to
be materialised, which meta tensors refuse), and host copies are counted by wrapping ``Tensor.cpu``.
tests/gpu runs the same analyses on a real GPU store against the CPU results.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lens
from lens.readout.logit_lens import lens_metrics, model_readout


@pytest.fixture(scope="module")
def disk_store(tiny_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("dev") / "s"
    lens.capture(tiny_llama, corpus="lee", max_tokens=300, seq_len=32, shard_tokens=64,
                 sites=["resid_post", "embed"], out=out, progress=False, dtype="float16")
    return out


def test_a_store_moved_to_a_device_reads_there(disk_store):
    host = lens.open_store(disk_store)
    held = host.to("meta")
    assert held.device == "meta" and held.get(layer=2).device.type == "meta"
    assert held.get(layer=2).dtype == torch.float16
    assert held.get("embed").shape == host.get("embed").shape
    view = held.view("resid_post").take(held.mask()).astype(torch.float32)
    assert view[1].device.type == "meta" and view[1].dtype == torch.float32 and view[1].shape[0] == view.n_tokens
    cpu = lens.open_store(disk_store, device="cpu")
    assert cpu.device == "cpu" and torch.equal(cpu.get(layer=3), host.get(layer=3))
    np.testing.assert_array_equal(cpu.view().take(cpu.mask()).at(3).numpy(), host.get(layer=3).numpy()[cpu.mask()])


def test_the_logit_lens_copies_results_to_the_host_once(tiny_llama, disk_store, monkeypatch):
    store = lens.open_store(disk_store, device="cpu")
    states = {l: store.get(layer=l, dtype=torch.float32) for l in range(3)}
    final, nxt = store.get(layer=3, dtype=torch.float32), store.tokens["next_token_id"]
    readout = model_readout(tiny_llama)
    ref = lens_metrics(states, final, nxt, readout, chunk_size=4096, topk_rows=[0, 5], fused=False)
    calls = []
    original = torch.Tensor.cpu

    def counting(self, *a, **k):
        calls.append(tuple(self.shape))
        return original(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "cpu", counting)
    got = lens_metrics(states, final, nxt, readout, chunk_size=16, topk_rows=[0, 5], fused=False)  # ~19 chunks x 3 layers
    monkeypatch.undo()
    assert len(calls) <= 8, calls  # the result arrays, once each: not once per chunk and layer
    for name in ("ce", "kl_to_final", "entropy", "top1_agreement", "mean_rank"):
        np.testing.assert_allclose(getattr(got, name), getattr(ref, name), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got.token_rank, ref.token_rank)
    np.testing.assert_array_equal(got.topk_ids, ref.topk_ids)


def test_nearest_tokens_are_searched_on_the_store_device(disk_store, monkeypatch):
    """On a "meta" store every step of the search must stay on the device (a host read of a meta tensor
    fails): the first thing asked to leave it is the 3 flags, then the (query, k) answer."""
    import geometry

    held = lens.open_store(disk_store).to("meta")
    left = []
    original = torch.Tensor.cpu

    def leaving(self, *a, **k):
        left.append((self.device.type, tuple(self.shape)))
        if self.device.type == "meta":
            raise RuntimeError("left the device")
        return original(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "cpu", leaving)
    for view, layer in ((held.view("resid_post"), 2), (held.view("resid_post").take(held.mask()), 1),
                        (held.view("embed"), None)):
        for metric in geometry.METRICS:
            left.clear()
            with pytest.raises(RuntimeError, match="left the device"):
                geometry.nearest(view, [3, 7], 5, layer=layer, metric=metric, eligible=None, chunk_size=64)
            assert left == [("meta", (3,))]
    # on the host: the same, and nothing but the flags and the (query, k) answer is copied
    cpu = lens.open_store(disk_store, device="cpu")
    left.clear()
    got = geometry.nearest(cpu.view("resid_post"), [3, 7], 5, layer=2, eligible=cpu.mask(), chunk_size=64)
    assert sorted(left) == [("cpu", (2, 5)), ("cpu", (2, 5)), ("cpu", (3,))]
    monkeypatch.undo()
    ref = geometry.nearest(cpu.get(layer=2).to(torch.float64).numpy(), [3, 7], 5, eligible=cpu.mask())
    np.testing.assert_array_equal(got.rows, ref.rows)
    np.testing.assert_allclose(got.distances, ref.distances, rtol=1e-12)
