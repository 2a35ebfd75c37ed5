"""Layer deletion and swap, and what they cost in next-token prediction.

"The Remarkable Robustness of LLMs: Stages of Inference?" (Lad, Gurnee & Tegmark 2024) deletes one
block (its output := its input) or swaps two adjacent blocks, without fine-tuning, and reports that
the models keep 72–95% of their next-token accuracy — except at the first and last layers.

* :func:`delete_layer` — a forward hook on block ``l`` that returns the block's input as its output
  (the residual stream skips the block). The hook is removed on exit, even after an exception.
* :func:`swap_layers` — blocks ``l`` and ``l+1`` trade places in the model's ``ModuleList`` (the
  modules themselves, so each keeps its own weights; the KV cache is off during evaluation, so the
  attention's ``layer_idx`` bookkeeping does not matter). The original order is put back on exit.

Both leave every parameter untouched, so the model is bitwise the same afterwards (tested).
:func:`ablation_scan` evaluates every deletion and every adjacent swap on windows of text: top-1
accuracy against the true next token relative to the intact model's ("retained accuracy"), agreement
with the intact model's top-1, and the change in cross-entropy (nats/token).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from lens.arch.taps import input_tensor
from lens.errors import LensInputError
from lens.logit_lens import log_softmax

log = logging.getLogger(__name__)


def _check_layer(model, layer: int, span: int = 1) -> int:
    n = model.n_layers
    if not isinstance(layer, (int, np.integer)) or not 0 <= int(layer) <= n - span:
        what = "a block index" if span == 1 else "the first of two adjacent blocks"
        raise LensInputError(f"expected {what} in 0..{n - span} for {model.model_id} ({n} layers), got {layer!r}")
    return int(layer)


@contextmanager
def delete_layer(model, layer: int):
    """Inside the block, block ``layer`` maps its input to itself (the model's forward skips it)."""
    layer = _check_layer(model, layer)
    block = model.layers[layer]

    def skip(module, args, kwargs, output):
        hidden = input_tensor(args, kwargs)
        if isinstance(output, tuple):  # older transformers return (hidden_states, ...)
            return (hidden,) + tuple(output[1:])
        return hidden

    handle = block.register_forward_hook(skip, with_kwargs=True)
    try:
        yield model
    finally:
        handle.remove()


@contextmanager
def swap_layers(model, layer: int):
    """Inside the block, blocks ``layer`` and ``layer + 1`` run in swapped order."""
    layer = _check_layer(model, layer, span=2)
    blocks = model.layers
    a, b = blocks[layer], blocks[layer + 1]
    blocks[layer], blocks[layer + 1] = b, a
    try:
        yield model
    finally:
        blocks[layer], blocks[layer + 1] = a, b


@dataclass(frozen=True)
class NextTokenScores:
    """Per scored token (axis ``token``, windows concatenated): ``logp`` (log-probability of the true
    next token, float64) and ``top1`` (the model's argmax token id)."""

    logp: np.ndarray
    top1: np.ndarray
    target: np.ndarray


@torch.inference_mode()
def next_token_scores(model, windows: Sequence[np.ndarray], targets: Sequence[np.ndarray], *,
                      batch_size: int = 8) -> NextTokenScores:
    """Run ``model`` on each window (token ids) and score positions whose target is not -1."""
    if len(windows) != len(targets):
        raise LensInputError(f"expected one target array per window; got {len(windows)} windows, {len(targets)}")
    pad = model.tokenizer.pad_token_id if getattr(model.tokenizer, "pad_token_id", None) is not None else 0
    logps, tops, tgts = [], [], []
    for lo in range(0, len(windows), batch_size):
        wins, tg = windows[lo:lo + batch_size], targets[lo:lo + batch_size]
        T = max(len(w) for w in wins)
        ids = torch.full((len(wins), T), pad, dtype=torch.long)
        att = torch.zeros((len(wins), T), dtype=torch.long)
        tgt = torch.full((len(wins), T), -1, dtype=torch.long)
        for i, (w, t) in enumerate(zip(wins, tg)):  # right padding: causal positions are unaffected
            ids[i, :len(w)] = torch.as_tensor(np.asarray(w))
            att[i, :len(w)] = 1
            tgt[i, :len(t)] = torch.as_tensor(np.asarray(t))
        logits = model.hf_model(input_ids=ids.to(model.device), attention_mask=att.to(model.device),
                                use_cache=False).logits.float()
        sel = (tgt >= 0).to(model.device)
        lg = logits[sel]
        t = tgt.to(model.device)[sel]
        logps.append(log_softmax(lg).gather(1, t[:, None])[:, 0].double().cpu().numpy())  # clamped exp: fast on CPU
        tops.append(lg.argmax(-1).cpu().numpy())
        tgts.append(t.cpu().numpy())
    if not logps or sum(len(x) for x in logps) == 0:
        raise LensInputError("no position has a known next token: expected windows with at least 2 tokens")
    return NextTokenScores(np.concatenate(logps), np.concatenate(tops), np.concatenate(tgts))


@dataclass(frozen=True)
class AblationResult:
    """Layer deletion / adjacent swap scan. Axis ``layer``: ``layers`` (block l deleted; blocks l and
    l+1 swapped — the swap entry of the last layer is NaN, there is no block after it).

    ``accuracy_*`` top-1 accuracy on the true next token; ``retained_accuracy_*`` = accuracy /
    intact accuracy; ``agreement_*`` fraction of tokens whose top-1 equals the intact model's;
    ``delta_ce_*`` = cross-entropy − intact cross-entropy (nats/token). Scalars: ``base_accuracy``,
    ``base_ce``, ``n_tokens``.
    """

    layers: np.ndarray
    accuracy_delete: np.ndarray
    accuracy_swap: np.ndarray
    retained_accuracy_delete: np.ndarray
    retained_accuracy_swap: np.ndarray
    agreement_delete: np.ndarray
    agreement_swap: np.ndarray
    delta_ce_delete: np.ndarray
    delta_ce_swap: np.ndarray
    base_accuracy: float
    base_ce: float
    n_tokens: int


def ablation_scan(model, windows: Sequence[np.ndarray], targets: Sequence[np.ndarray], *,
                  layers: Sequence[int] | None = None, swap: bool = True, batch_size: int = 8,
                  progress: bool = False) -> AblationResult:
    """Delete each block in ``layers`` (default all) and swap it with the next; score each variant."""
    if not model.has_lm_head:
        raise LensInputError(f"{model.model_id} has no language-model head: layer ablation measures next-token "
                             "prediction and needs a causal LM")
    layers = list(range(model.n_layers)) if layers is None else [_check_layer(model, l) for l in layers]
    base = next_token_scores(model, windows, targets, batch_size=batch_size)
    base_acc = float((base.top1 == base.target).mean())
    base_ce = float(-base.logp.mean())
    L = len(layers)
    res = {k: np.full(L, np.nan) for k in ("acc_d", "acc_s", "agr_d", "agr_s", "ce_d", "ce_s")}
    bar = tqdm(total=L * (2 if swap else 1), desc="layer ablation", unit="variant", disable=not progress)

    def score(tag, i):
        s = next_token_scores(model, windows, targets, batch_size=batch_size)
        res[f"acc_{tag}"][i] = (s.top1 == s.target).mean()
        res[f"agr_{tag}"][i] = (s.top1 == base.top1).mean()
        res[f"ce_{tag}"][i] = -s.logp.mean() - base_ce
        bar.update(1)

    for i, l in enumerate(layers):
        with delete_layer(model, l):
            score("d", i)
        if swap and l < model.n_layers - 1:
            with swap_layers(model, l):
                score("s", i)
    bar.close()
    denom = base_acc if base_acc > 0 else np.nan
    if base_acc == 0:
        log.warning("the intact model gets no next token right: retained accuracy is undefined (NaN)")
    return AblationResult(
        layers=np.asarray(layers, np.int64), accuracy_delete=res["acc_d"], accuracy_swap=res["acc_s"],
        retained_accuracy_delete=res["acc_d"] / denom, retained_accuracy_swap=res["acc_s"] / denom,
        agreement_delete=res["agr_d"], agreement_swap=res["agr_s"], delta_ce_delete=res["ce_d"],
        delta_ce_swap=res["ce_s"], base_accuracy=base_acc, base_ce=base_ce, n_tokens=int(base.logp.size))
