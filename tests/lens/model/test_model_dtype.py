"""The model's dtype (``--model-dtype``) and attention (``--attn``): a bfloat16 capture equals Hugging Face's
bfloat16 hidden states, the store and every result record both, a store of another model dtype does not
serve a study, and the logit lens of a bfloat16 model decodes in float32."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch

import lens
from lens.text.corpora import load_corpus, make_windows
from lens.errors import LensInputError
from lens.model.loading import resolve_model_dtype

FAMILIES = ("tiny-llama", "tiny-gpt2", "tiny:gemma2", "tiny:qwen2", "tiny:gpt_neox")
CAPTURE = dict(corpus="lee", max_tokens=96, seq_len=32, batch_size=4, progress=False)


@pytest.fixture(scope="module")
def bf16_models():
    return {}


def _bf16(spec: str, cache: dict) -> lens.LoadedModel:
    if spec not in cache:
        cache[spec] = lens.load_model(spec, dtype="bfloat16")
    return cache[spec]


def _hf_hidden_rows(model, win, batch_size: int) -> list[torch.Tensor]:
    """Hugging Face's ``output_hidden_states`` on the capture's own padded batches, as (token, d) rows per
    hidden state (embeddings, then each block's output; HF's last one is after the final norm)."""
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    rows: list[list[torch.Tensor]] = []
    with torch.inference_mode():
        for lo in range(0, len(win.input_ids), batch_size):
            chunk = win.input_ids[lo:lo + batch_size]
            width = max(len(c) for c in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, c in enumerate(chunk):
                ids[i, :len(c)] = torch.as_tensor(c)
                mask[i, :len(c)] = 1
            hs = model.hf_model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
            keep = mask.bool()
            if not rows:
                rows = [[] for _ in hs]
            for k, h in enumerate(hs):
                rows[k].append(h[keep])
    return [torch.cat(r) for r in rows]


@pytest.mark.parametrize("spec", FAMILIES)
def test_bfloat16_capture_equals_hf_hidden_states(spec, bf16_models):
    model = _bf16(spec, bf16_models)
    assert model.dtype == torch.bfloat16
    sites = ["embed", "resid_post"] + (["final_norm"] if model.has_lm_head else [])
    store = lens.capture(model, sites=sites, **CAPTURE)
    assert store.manifest["settings"]["model_dtype"] == "bfloat16" and store.manifest["model"]["dtype"] == "bfloat16"
    assert store.manifest["settings"]["attn"] == "eager" and store.manifest["dtype"] == "float32"  # stored: float32
    win = make_windows(load_corpus("lee"), model.tokenizer, seq_len=32, max_tokens=96, is_causal=model.is_causal)
    hs = _hf_hidden_rows(model, win, CAPTURE["batch_size"])
    assert hs[0].dtype == torch.bfloat16 and store.n_tokens == len(hs[0]) == 96
    L = model.n_layers
    # float32 storage holds bfloat16 values exactly: the rows equal HF's bit for bit
    assert torch.equal(store.get(site="embed"), hs[0].float())
    for layer in range(L - 1):
        got = store.get("resid_post", layer)
        assert torch.equal(got, hs[layer + 1].float()), f"{spec} resid_post {layer}"
        assert torch.equal(got.to(torch.bfloat16).float(), got)  # a bfloat16 forward, not a float32 one
    if model.has_lm_head:
        assert torch.equal(store.get(site="final_norm"), hs[L].float())


@pytest.mark.parametrize("backend", ["transformer-lens", "nnsight"])
def test_bfloat16_backends_equal_native(backend, bf16_models):
    model = _bf16("tiny-llama", bf16_models)
    sites = ["embed", "resid_post"]
    native = lens.capture(model, sites=sites, **CAPTURE)
    other = lens.capture(model, sites=sites, backend=backend, **CAPTURE)
    assert other.manifest["settings"]["model_dtype"] == "bfloat16"
    for layer in range(model.n_layers):
        torch.testing.assert_close(other.get("resid_post", layer), native.get("resid_post", layer), atol=0, rtol=0)


def test_auto_resolves_by_device():
    assert resolve_model_dtype("auto", "cpu") == "float32"
    assert resolve_model_dtype("auto", "cuda:1") == "bfloat16"
    assert resolve_model_dtype(None) == "float32" and resolve_model_dtype("bf16") == "bfloat16"
    with pytest.raises(LensInputError, match="model dtype 'int8'"):
        resolve_model_dtype("int8", "cpu")
    assert lens.load_model("tiny-gpt2", dtype="auto", device="cpu").dtype == torch.float32


def test_resume_with_another_model_dtype_is_refused(tmp_path, bf16_models):
    out = tmp_path / "s"
    lens.capture(_bf16("tiny-gpt2", bf16_models), out=out, **CAPTURE)
    with pytest.raises(LensInputError, match="model_dtype: store has 'bfloat16', this run has 'float32'"):
        lens.capture(lens.load_model("tiny-gpt2"), out=out, resume=True, **CAPTURE)
    # a store from before the settings named them: its card's dtype and eager attention stand in
    from lens.store.format import commit_manifest

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"].pop("model_dtype") == "bfloat16" and manifest["settings"].pop("attn") == "eager"
    commit_manifest(out, manifest)
    assert lens.capture(_bf16("tiny-gpt2", bf16_models), out=out, resume=True, **CAPTURE).complete
    sdpa = lens.load_model("tiny-gpt2", dtype="bfloat16", attn_implementation="sdpa")
    with pytest.raises(LensInputError, match="attn: store has 'eager', this run has 'sdpa'"):
        lens.capture(sdpa, out=out, resume=True, **CAPTURE)


def test_float32_lens_of_a_bfloat16_model(bf16_models):
    """The lens of a bfloat16 model decodes in float32: it equals the lens of a float32 copy of the same
    (bfloat16-valued) weights, not the bfloat16 decoding."""
    from lens.readout.logit_lens import decode_precision, logit_lens

    model = _bf16("tiny-llama", bf16_models)
    store = lens.capture(model, sites=["resid_post"], **CAPTURE)
    states = {l: store.get("resid_post", l) for l in range(model.n_layers)}
    nt = np.asarray(store.tokens["next_token_id"])
    got = logit_lens(model, states, states[model.n_layers - 1], nt)
    up = lens.load_model(copy.deepcopy(model.hf_model).float(), tokenizer=model.tokenizer)
    want = logit_lens(up, states, states[model.n_layers - 1], nt)
    np.testing.assert_allclose(got.token_ce, want.token_ce, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.kl_to_final, want.kl_to_final, rtol=1e-4, atol=1e-6)
    assert model.dtype == torch.bfloat16  # the model itself was left in bfloat16
    assert decode_precision(model).startswith("float32 (bfloat16 model") and decode_precision(up) == "float32"
    # the bfloat16 decoding (norm and unembedding in bfloat16) is measurably different
    x = torch.as_tensor(states[1][:64]).to(torch.bfloat16)
    bf = torch.log_softmax(model.decode(x).float(), -1)
    f32 = torch.log_softmax(up.decode(x.float()), -1)
    assert (bf - f32).abs().max() > 1e-3


def test_study_records_model_dtype_and_refuses_another_store(tmp_path):
    from studies.core.config import with_model_settings
    from studies.logit_lens.study import S, Config
    from studies.job.main_job import _fitted
    from studies.core.registry import get_study
    from studies.reporting.results import read_result
    from studies.core.runner import run_study

    assert with_model_settings(Config(device="cpu")).model_dtype == "float32"  # auto, on a CPU
    store = tmp_path / "store"
    cfg = Config(model="tiny-llama", corpus="lee", max_tokens=192, seq_len=32, store=str(store), progress=False,
                 model_dtype="bfloat16", sample_tokens=0, topk_tokens=8, check_windows=1)
    run_study("logit-lens", cfg, tmp_path / "bf16")
    rec = read_result(tmp_path / "bf16")
    assert rec.config["model_dtype"] == "bfloat16" and rec.config["attn"] == "eager"
    assert rec.summary[S.decode_precision].startswith("float32 (bfloat16 model")
    assert lens.open_store(store).manifest["settings"]["model_dtype"] == "bfloat16"
    float_cfg = dataclasses.replace(cfg, model_dtype="auto")  # float32 on this CPU
    with pytest.raises(LensInputError, match="captured with the model in bfloat16, but this study runs it in float32"):
        run_study("logit-lens", float_cfg, tmp_path / "f32")
    # the main job gives such a study a store of its own instead
    fitted = _fitted(get_study("logit-lens"), with_model_settings(float_cfg), str(store), tmp_path / "job")
    assert fitted.store == str(tmp_path / "job" / "logit-lens" / "store")
    fitted = _fitted(get_study("logit-lens"), cfg, str(store), tmp_path / "job")
    assert fitted.store == str(store)


def test_cli_flags(tmp_path):
    from app.commands.cli import build_parser, main

    args = build_parser().parse_args(["capture", "tiny-gpt2", "--out", "x", "--model-dtype", "bfloat16",
                                      "--attn", "sdpa", "--dtype", "float16"])
    assert (args.model_dtype, args.attn, args.dtype) == ("bfloat16", "sdpa", "float16")
    for cmd in (["inspect", "tiny-gpt2"], ["stats", "tiny-gpt2", "--out", "x"], ["study", "all", "--out", "x"]):
        a = build_parser().parse_args(cmd)
        assert (a.model_dtype, a.attn) == ("auto", "eager")
    with pytest.raises(SystemExit) as exc:
        main(["capture", "tiny-gpt2", "--out", str(tmp_path / "s"), "--model-dtype", "int8"])
    assert exc.value.code == 2
    assert main(["capture", "tiny-gpt2", "--out", str(tmp_path / "s"), "--model-dtype", "bfloat16", "--attn",
                 "sdpa", "--corpus", "lee", "--max-tokens", "64", "--seq-len", "32", "--quiet"]) == 0
    settings = lens.open_store(tmp_path / "s").manifest["settings"]
    assert (settings["model_dtype"], settings["attn"], settings["dtype"]) == ("bfloat16", "sdpa", "float32")


def test_model_folder_loads_straight_into_bfloat16(tmp_path):
    """A saved model is read into the dtype asked for (no float32 copy first): the same weights as a
    float32 load cast to bfloat16."""
    f32 = lens.load_model("tiny-gpt2")
    f32.hf_model.save_pretrained(tmp_path / "m")
    f32.tokenizer.save_pretrained(tmp_path / "m")
    bf = lens.load_model(str(tmp_path / "m"), dtype="bfloat16", attn_implementation="sdpa")
    assert bf.dtype == torch.bfloat16 and bf.card().dtype == "bfloat16"
    from lens.model.loading import attn_implementation

    assert attn_implementation(bf) == "sdpa" and attn_implementation(f32) == "eager"
    want = dict(f32.hf_model.named_parameters())
    for name, p in bf.hf_model.named_parameters():
        assert torch.equal(p, want[name].to(torch.bfloat16)), name


@pytest.mark.parametrize("spec", FAMILIES)
def test_bfloat16_model_has_the_float32_site_map(spec, bf16_models):
    """The site map is derived on the model as loaded: in bfloat16 it finds the same block kind, sites and
    verified head as in float32 (the probe's identities hold to bfloat16 rounding, not float32's)."""
    a, b = lens.load_model(spec).card(), _bf16(spec, bf16_models).card()
    assert b.dtype == "bfloat16" and a.dtype == "float32"
    assert (b.block, b.sites, b.absent, b.norm_kind, b.has_lm_head) == (a.block, a.sites, a.absent, a.norm_kind,
                                                                         a.has_lm_head)
