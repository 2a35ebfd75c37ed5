"""CUDA paths: capture on the GPU, stores held on the GPU, analyses on GPU tensors.

Skipped where torch sees no CUDA device (CI has none); `scripts/gpu_check.sh` runs them on a GPU machine.
"""

import numpy as np
import pytest
import torch

import lens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def model_cuda():
    from transformers import LlamaConfig, LlamaForCausalLM

    from lens.model.loading import _finish

    torch.manual_seed(0)
    tok = _tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")
    return lens.load_model(LlamaForCausalLM(cfg), tokenizer=tok)


def _tokenizer():
    try:
        return lens.load_model("tiny-llama").tokenizer
    except lens.LensInputError:
        from transformers import AutoTokenizer
        import os

        return AutoTokenizer.from_pretrained(os.environ["LENS_GPU_TOKENIZER"])


TEXTS = ["The cat sat on the mat and looked at the dog. " * 6, "Paris is the capital of France. " * 8,
         "Numbers like 1, 2 and 3 are small. " * 7]


def test_capture_on_cuda_equals_cpu_and_store_on_gpu(model_cuda, tmp_path):
    cpu = lens.capture(model_cuda, corpus=TEXTS, sites=["resid_post", "attn_out"], max_tokens=None, progress=False)
    model_cuda.hf_model.to("cuda")
    try:
        gpu = lens.capture(model_cuda, corpus=TEXTS, sites=["resid_post", "attn_out"], max_tokens=None, progress=False)
        assert gpu.get(layer=0).device.type == "cuda"
        for l in range(4):
            torch.testing.assert_close(gpu.get(layer=l).cpu(), cpu.get(layer=l), atol=1e-4, rtol=1e-4)
        disk = lens.capture(model_cuda, corpus=TEXTS, max_tokens=None, progress=False, out=tmp_path / "s",
                            dtype="bfloat16")
        held = lens.open_store(tmp_path / "s", device="cuda")
        assert held.get(layer=2).device.type == "cuda" and held.get(layer=2).dtype == torch.bfloat16
        torch.testing.assert_close(held.get(layer=2).cpu(), disk.get(layer=2))
    finally:
        model_cuda.hf_model.to("cpu")


def test_intrinsic_dimension_on_cuda_equals_cpu():
    import geometry

    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.normal(size=(256, 5)))[0]
    X = rng.normal(size=(4000, 5)) @ basis.T + 1e-3 * rng.normal(size=(4000, 256))
    cpu = geometry.TwoNN().fit(X).dimension_
    gpu = geometry.TwoNN().fit(torch.as_tensor(X, device="cuda")).dimension_
    assert abs(cpu - gpu) < 1e-3 * max(1, abs(cpu))
    mle_cpu = geometry.MLE(n_neighbors=20).fit(X).dimension_
    mle_gpu = geometry.MLE(n_neighbors=20).fit(torch.as_tensor(X, device="cuda")).dimension_
    assert abs(mle_cpu - mle_gpu) < 1e-3 * max(1, abs(mle_cpu))


def test_prediction_residual_on_cuda_equals_cpu():
    from probes import PredictionResidual

    rng = np.random.default_rng(0)
    n, d, V = 3000, 32, 50
    y = rng.integers(0, V, size=n)
    W = rng.normal(size=(V, d))
    X = np.stack([W[y] * s + rng.normal(size=(n, d)) for s in (0.2, 0.5, 1.0)])
    docs = np.repeat(np.arange(30), n // 30)
    cpu = PredictionResidual().fit(X, y, docs).result_.pr
    gpu = PredictionResidual().fit(torch.as_tensor(X, device="cuda"), y, docs).result_.pr
    np.testing.assert_allclose(gpu, cpu, rtol=1e-4)


def test_logit_lens_on_cuda_equals_cpu(model_cuda):
    from lens.readout.logit_lens import logit_lens

    store = lens.capture(model_cuda, corpus=TEXTS, max_tokens=None, progress=False)
    states = {l: store.get(layer=l) for l in range(3)}
    final, nxt = store.get(layer=3), store.tokens["next_token_id"]
    cpu = logit_lens(model_cuda, states, final, nxt, chunk_size=64)
    model_cuda.hf_model.to("cuda")
    try:
        gpu = logit_lens(model_cuda, {l: x.cuda() for l, x in states.items()}, final.cuda(), nxt, chunk_size=64)
    finally:
        model_cuda.hf_model.to("cpu")
    np.testing.assert_allclose(gpu.ce, cpu.ce, rtol=1e-4)
    np.testing.assert_allclose(gpu.kl_to_final, cpu.kl_to_final, rtol=1e-3, atol=1e-5)
