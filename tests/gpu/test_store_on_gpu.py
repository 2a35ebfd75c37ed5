"""Issue 12 on a GPU: analyses (and the explorer's nearest-tokens query) read a store held on the GPU and
equal the CPU results; the pipelined capture (side-stream copies into pinned buffers) writes the serial
capture's bytes; a model split by a device_map across the GPU and host memory captures the unsplit model's
states; parts merge exactly.

Skipped where torch sees no CUDA device; scripts/gpu_check.sh runs them on a GPU machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import lens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lens"))

KW = dict(corpus="lee", max_tokens=3000, seq_len=64, batch_size=8, shard_tokens=1024,
          sites=["resid_post", "embed"], progress=False)


@pytest.fixture(scope="module")
def model():
    return lens.load_model("tiny-llama")


@pytest.fixture(scope="module")
def stores(model, tmp_path_factory):
    """The same disk store opened on the host and held on the GPU."""
    out = tmp_path_factory.mktemp("gpu") / "s"
    lens.capture(model, out=out, **KW)
    return lens.open_store(out, device="cpu"), lens.open_store(out, device="cuda")


def _layers(store, dtype=torch.float32):
    return store.view("resid_post").take(store.mask()).astype(dtype)


def test_a_gpu_store_reads_on_the_gpu(stores):
    cpu, gpu = stores
    view = _layers(gpu)
    assert gpu.get(layer=1).device.type == "cuda" and view[2].device.type == "cuda"
    torch.testing.assert_close(view[2].cpu(), _layers(cpu)[2], rtol=0, atol=0)


def test_intrinsic_dimension_on_a_gpu_store_equals_cpu(stores):
    import geometry

    cpu, gpu = stores
    for i in (1, 3):
        a = geometry.TwoNN().fit(_layers(cpu, torch.float64)[i]).dimension_
        b = geometry.TwoNN().fit(_layers(gpu, torch.float64)[i]).dimension_
        assert abs(a - b) < 1e-6 * max(1.0, abs(a)), (a, b)


def test_anisotropy_and_linearity_on_a_gpu_store_equal_cpu(stores):
    import geometry

    cpu, gpu = stores
    words = cpu.tokens["token_id"][cpu.mask()]
    a = geometry.anisotropy(_layers(cpu)[2], words=words)
    b = geometry.anisotropy(_layers(gpu)[2], words=words)
    for name in ("mean_cosine", "top_pc_share", "self_similarity", "mev"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-6, atol=1e-9, err_msg=name)
    la = geometry.linearity_score(_layers(cpu)[1], _layers(cpu)[2])
    lb = geometry.linearity_score(_layers(gpu)[1], _layers(gpu)[2])
    assert abs(la - lb) < 1e-5


def test_nearest_tokens_on_a_gpu_store_equal_cpu(stores):
    import geometry

    cpu, gpu = stores
    for metric in geometry.METRICS:
        for layer in (0, 3):
            a = geometry.nearest(cpu.view("resid_post"), [5, 900, 2000], 20, layer=layer, metric=metric,
                                 eligible=cpu.mask(min_pos=1))
            b = geometry.nearest(gpu.view("resid_post"), [5, 900, 2000], 20, layer=layer, metric=metric,
                                 eligible=gpu.mask(min_pos=1), chunk_size=1 << 16)
            np.testing.assert_array_equal(b.rows, a.rows)
            np.testing.assert_allclose(b.distances, a.distances, rtol=1e-12, atol=1e-15)


def test_prediction_residual_on_a_gpu_store_equals_cpu(stores):
    from probes import PredictionResidual

    cpu, gpu = stores
    mask = cpu.mask() & (cpu.tokens["next_token_id"] >= 0)
    y, docs = cpu.tokens["next_token_id"][mask], cpu.tokens["doc"][mask]
    xa = torch.stack([cpu.get(layer=l, dtype=torch.float32)[torch.as_tensor(mask)] for l in (0, 2)])
    xb = torch.stack([gpu.get(layer=l, dtype=torch.float32)[torch.as_tensor(mask, device="cuda")] for l in (0, 2)])
    np.testing.assert_allclose(PredictionResidual().fit(xb, y, docs).result_.pr,
                               PredictionResidual().fit(xa, y, docs).result_.pr, rtol=1e-4)


def test_logit_lens_on_a_gpu_store_equals_cpu(model, stores):
    from lens.readout.logit_lens import lens_metrics, model_readout

    cpu, gpu = stores
    ref = lens_metrics({l: cpu.get(layer=l) for l in range(3)}, cpu.get(layer=3), cpu.tokens["next_token_id"],
                       model_readout(model), chunk_size=256)
    model.hf_model.to("cuda")
    try:
        got = lens_metrics({l: gpu.get(layer=l) for l in range(3)}, gpu.get(layer=3), gpu.tokens["next_token_id"],
                           model_readout(model), chunk_size=256)
    finally:
        model.hf_model.to("cpu")
    np.testing.assert_allclose(got.ce, ref.ce, rtol=1e-4)
    np.testing.assert_allclose(got.kl_to_final, ref.kl_to_final, rtol=1e-3, atol=1e-5)


def test_pipelined_cuda_capture_writes_the_serial_bytes(model, tmp_path):
    from store_harness import assert_same_store

    model.hf_model.to("cuda")
    try:
        for dtype in ("float16", "bfloat16"):
            lens.capture(model, out=tmp_path / f"serial-{dtype}", dtype=dtype, pipeline=False, **KW)
            lens.capture(model, out=tmp_path / f"piped-{dtype}", dtype=dtype, **KW)
            assert_same_store(tmp_path / f"piped-{dtype}", tmp_path / f"serial-{dtype}")
        held = lens.capture(model, dtype="float16", **KW)  # a GPU store, captured without a sync per batch
        assert held.get(layer=1).device.type == "cuda"
        torch.testing.assert_close(held.get(layer=1).cpu(), lens.open_store(tmp_path / "piped-float16").get(layer=1))
    finally:
        model.hf_model.to("cpu")


def test_device_map_across_gpu_and_host_captures_the_unsplit_states(model, tmp_path):
    folder = tmp_path / "model"
    model.hf_model.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": "cpu",
                  "model.layers.2": 0, "model.layers.3": "cpu", "model.norm": 0, "lm_head": 0}
    split = lens.load_model(folder, device_map=device_map)
    assert split.device.type == "cuda"
    ref = lens.capture(model, **KW)
    for backend in ("native", "nnsight", "transformer-lens"):
        got = lens.capture(split, backend=backend, **KW)
        for l in range(4):
            torch.testing.assert_close(got.get(layer=l).cpu(), ref.get(layer=l), atol=1e-4, rtol=1e-4)


def test_parts_captured_on_the_gpu_merge_into_one_store(model, tmp_path):
    from lens.store.parts import merge_stores
    from store_harness import store_files

    model.hf_model.to("cuda")
    try:
        lens.capture(model, out=tmp_path / "single", **KW)
        for i in (1, 2):
            lens.capture(model, out=tmp_path / f"p{i}", part=f"{i}/2", **KW)
    finally:
        model.hf_model.to("cpu")
    merge_stores([tmp_path / "p2", tmp_path / "p1"], tmp_path / "m")
    a, b = store_files(tmp_path / "m"), store_files(tmp_path / "single")
    assert sorted(a) == sorted(b) and all(a[k] == b[k] for k in a if k != "manifest.json")
