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
with the intact model's top-1, and the change in cross-entropy (nats/token). A variant changes
nothing before its first changed block, so the scan records every block's input on one clean pass
per batch and runs each variant from there (:mod:`lens.interventions.replay`), many variants per block call; the
context managers above are the reference it is tested against and its fallback.
:func:`lens.interventions.steering.steering_sweep` scores a sweep of steering values the same way (on the last
token alone, against each prompt's KV cache, or by the same replay).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from lens.capturing.batches import pad_id, padded_tensors
from lens.model.arch.taps import input_tensor
from lens.errors import LensInputError
from lens.readout.row_stats import row_stats, use_fused
from lens.capturing.backends import make_backend
from lens.sites import HookSite, Site
from lens.interventions.replay import record_block_inputs, record_checked, run_variants

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


def _padded(model, wins, tg):
    """(ids, attention mask, targets) of a batch of windows, right-padded (causal positions are
    unaffected by the padding)."""
    ids, att = padded_tensors(wins, pad_id(model.tokenizer))
    tgt, _ = padded_tensors(tg, -1, width=ids.shape[1])
    return ids, att, tgt


def _scored(logits: torch.Tensor, t: torch.Tensor, fused: bool = False):
    """(log p of the target, top-1) per row of float32 ``logits``: the row statistics of
    :func:`lens.readout.row_stats.row_stats` (max and first argmax, the clamped exp-sum; one compiled pass
    when ``fused``), no (row, vocab) log-softmax array."""
    t_logit = logits.gather(1, t[:, None])[:, 0]
    mx, top1, z, _, _ = row_stats(logits, t_logit, fused=fused)
    return t_logit - (mx + z.log()), top1


@torch.inference_mode()
def next_token_scores(model, windows: Sequence[np.ndarray], targets: Sequence[np.ndarray], *,
                      batch_size: int = 8, progress: bool = False, desc: str = "next-token scores") -> NextTokenScores:
    """Run ``model`` on each window (token ids) and score positions whose target is not -1 (in window
    order, each window's positions in order)."""
    if len(windows) != len(targets):
        raise LensInputError(f"expected one target array per window; got {len(windows)} windows, {len(targets)}")

    fused = use_fused(model.device, int(sum(len(w) for w in windows)), None)
    # the last block's output, decoded (final norm + unembedding) at the scored positions only: no
    # (position, vocab) logits for pads and unscored ends; the lens of the last layer is the model's output
    last = HookSite(Site.RESID_POST, model.n_layers - 1)
    engine = make_backend("native", model, [last])
    # batches of similar lengths (longest first, stable): less padding; the scores go back to window order
    order = sorted(range(len(windows)), key=lambda i: -len(windows[i]))
    per_window: list = [None] * len(windows)
    for lo in tqdm(range(0, len(windows), batch_size), desc=desc, unit="batch", disable=not progress):
        batch = order[lo:lo + batch_size]
        ids, att, tgt = _padded(model, [windows[i] for i in batch], [targets[i] for i in batch])
        states, _ = engine.run(ids.to(model.device), att.to(model.device))
        sel = (tgt >= 0).to(model.device)
        t = tgt.to(model.device)[sel]
        logp, top1 = _scored(model.decode(states[last.key][sel]).float(), t, fused)
        logp, top1, t = logp.double().cpu().numpy(), top1.cpu().numpy(), t.cpu().numpy()
        cuts = np.cumsum(sel.sum(1).cpu().numpy())[:-1]
        for i, a, b, c in zip(batch, np.split(logp, cuts), np.split(top1, cuts), np.split(t, cuts)):
            per_window[i] = (a, b, c)
    if not per_window or sum(len(x[0]) for x in per_window) == 0:
        raise LensInputError("no position has a known next token: expected windows with at least 2 tokens")
    return NextTokenScores(*(np.concatenate([x[k] for x in per_window]) for k in range(3)))


@dataclass(frozen=True)
class AblationResult:
    """Layer deletion / adjacent swap scan. Axis ``layer``: ``layers`` (block l deleted; blocks l and
    l+1 swapped — the swap entry of the last layer is NaN, there is no block after it).

    ``accuracy_*`` top-1 accuracy on the true next token; ``retained_accuracy_*`` = accuracy /
    intact accuracy; ``agreement_*`` fraction of tokens whose top-1 equals the intact model's;
    ``delta_ce_*`` = cross-entropy − intact cross-entropy (nats/token). Scalars: ``base_accuracy``,
    ``base_ce``, ``n_tokens``.

    Per window (axis ``window``, the order of the windows given), what a resample of windows or documents
    needs: ``window_n`` scored tokens, ``window_base_correct`` the intact model's correct top-1 count, and
    ``window_correct_delete`` / ``window_correct_swap`` (layer, window) each variant's (NaN where there is no
    variant, the swap of the last layer).
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
    window_n: np.ndarray | None = None
    window_base_correct: np.ndarray | None = None
    window_correct_delete: np.ndarray | None = None
    window_correct_swap: np.ndarray | None = None


def _variants(model, layers, swap):
    """(tag, index in ``layers``, first block changed, blocks run from its recorded input):
    block l deleted runs l+1.., blocks l, l+1 swapped run l+1, l, l+2.. (the module order a
    swapped ModuleList gives)."""
    L = model.n_layers
    out = []
    for i, l in enumerate(layers):
        out.append(("d", i, l, list(range(l + 1, L))))
        if swap and l < L - 1:
            out.append(("s", i, l, [l + 1, l] + list(range(l + 2, L))))
    return out


def ablation_scan(model, windows: Sequence[np.ndarray], targets: Sequence[np.ndarray], *,
                  layers: Sequence[int] | None = None, swap: bool = True, batch_size: int = 8,
                  progress: bool = False, replay: bool | None = None, max_rows: int = 8192) -> AblationResult:
    """Delete each block in ``layers`` (default all) and swap it with the next; score each variant.

    ``replay`` (default: when the model's blocks replay exactly, checked on the first batch): one
    clean forward per batch records every block's input (:mod:`lens.interventions.replay`), and each variant runs
    only the blocks from its first changed one on, variants stacked into calls of ``max_rows``
    token rows — about half the block work of whole forward passes, and the intact scores come
    from the recording pass. ``replay=False``: a whole forward pass per variant and batch under
    :func:`delete_layer` / :func:`swap_layers` (the reference the replay is tested against)."""
    if not model.has_lm_head:
        raise LensInputError(f"{model.model_id} has no language-model head: layer ablation measures next-token "
                             "prediction and needs a causal LM")
    if len(windows) != len(targets):
        raise LensInputError(f"expected one target array per window; got {len(windows)} windows, {len(targets)}")
    layers = list(range(model.n_layers)) if layers is None else [_check_layer(model, l) for l in layers]
    variants = _variants(model, layers, swap)
    if replay is not False and layers:
        sums = _scan_replay(model, windows, targets, variants, batch_size, progress, max_rows, strict=bool(replay))
    else:
        sums = None
    if sums is None:
        sums = _scan_forward(model, windows, targets, variants, batch_size, progress)
    n, base_correct, base_logp, per_variant, win_n, win_base, win_variant = sums
    if n == 0:
        raise LensInputError("no position has a known next token: expected windows with at least 2 tokens")
    base_acc = base_correct / n
    base_ce = -base_logp / n
    L = len(layers)
    res = {k: np.full(L, np.nan) for k in ("acc_d", "acc_s", "agr_d", "agr_s", "ce_d", "ce_s")}
    win = {tag: np.full((L, len(windows)), np.nan) for tag in ("d", "s")}
    for (tag, i, _, _), (correct, agree, logp), per_win in zip(variants, per_variant, win_variant):
        win[tag][i] = per_win
        res[f"acc_{tag}"][i] = correct / n
        res[f"agr_{tag}"][i] = agree / n
        res[f"ce_{tag}"][i] = -logp / n - base_ce
    denom = base_acc if base_acc > 0 else np.nan
    if base_acc == 0:
        log.warning("the intact model gets no next token right: retained accuracy is undefined (NaN)")
    return AblationResult(
        layers=np.asarray(layers, np.int64), accuracy_delete=res["acc_d"], accuracy_swap=res["acc_s"],
        retained_accuracy_delete=res["acc_d"] / denom, retained_accuracy_swap=res["acc_s"] / denom,
        agreement_delete=res["agr_d"], agreement_swap=res["agr_s"], delta_ce_delete=res["ce_d"],
        delta_ce_swap=res["ce_s"], base_accuracy=float(base_acc), base_ce=float(base_ce), n_tokens=int(n),
        window_n=np.asarray(win_n, np.int64), window_base_correct=np.asarray(win_base, np.int64),
        window_correct_delete=win["d"], window_correct_swap=win["s"])


def _per_window(hits, counts) -> np.ndarray:
    """Per window: the sum of ``hits`` (one per scored token, windows concatenated in order) of each window,
    ``counts`` its scored tokens."""
    counts = np.asarray(counts, np.int64)
    idx = np.repeat(np.arange(len(counts)), counts)
    return np.bincount(idx, weights=np.asarray(hits, float), minlength=len(counts)).astype(np.int64)


def _scan_forward(model, windows, targets, variants, batch_size, progress):
    """Whole forward passes, one per variant (the reference path)."""
    base = next_token_scores(model, windows, targets, batch_size=batch_size)
    counts = [int((np.asarray(t) >= 0).sum()) for t in targets]
    per_variant, per_window = [], []
    for tag, _, l, _ in tqdm(variants, desc="layer ablation", unit="variant", disable=not progress):
        with (delete_layer if tag == "d" else swap_layers)(model, l):
            s = next_token_scores(model, windows, targets, batch_size=batch_size)
        per_variant.append((int((s.top1 == s.target).sum()), int((s.top1 == base.top1).sum()), float(s.logp.sum())))
        per_window.append(_per_window(s.top1 == s.target, counts))
    return (int(base.logp.size), int((base.top1 == base.target).sum()), float(base.logp.sum()), per_variant,
            np.asarray(counts, np.int64), _per_window(base.top1 == base.target, counts), per_window)


@torch.inference_mode()
def _scan_replay(model, windows, targets, variants, batch_size, progress, max_rows, strict):
    """Per batch: one recording forward, then every variant from its first changed block. None when
    the first batch does not replay (the caller falls back to whole forward passes)."""
    first = min(v[2] for v in variants)
    fused = use_fused(model.device, int(sum(len(w) for w in windows)) * (len(variants) + 1), None)
    n, base_correct, base_logp = 0, 0, 0.0
    per_variant = [[0, 0, 0.0] for _ in variants]
    win_n, win_base = np.zeros(len(windows), np.int64), np.zeros(len(windows), np.int64)
    win_variant = [np.zeros(len(windows), np.int64) for _ in variants]
    n_batches = -(-len(windows) // batch_size)
    bar = tqdm(total=n_batches * len(variants), desc="layer ablation", unit="variant", disable=not progress)
    try:
        for b, lo in enumerate(range(0, len(windows), batch_size)):
            ids, att, tgt = _padded(model, windows[lo:lo + batch_size], targets[lo:lo + batch_size])
            if b == 0:  # the first batch checks that this family's blocks replay
                rec, problem = record_checked(model, ids, att, start=first)
            else:
                rec, problem = record_block_inputs(model, ids, att, start=first), None
            if problem:
                if strict:
                    raise RuntimeError(f"{model.model_id}: {problem}")
                log.warning("%s: %s; layer ablation runs whole forward passes instead", model.model_id, problem)
                return None
            sel = (tgt >= 0).to(model.device)
            t = tgt.to(model.device)[sel]
            if not len(t):
                bar.update(len(variants))
                continue
            logp, top1 = _scored(model.decode(rec.last[sel]).float(), t, fused)
            rows = sel.nonzero()[:, 0].cpu().numpy()  # the batch row (window) of each scored token
            n_rows = sel.shape[0]
            win_n[lo:lo + n_rows] += np.bincount(rows, minlength=n_rows)
            win_base[lo:lo + n_rows] += np.bincount(rows, weights=(top1 == t).cpu().numpy(),
                                                    minlength=n_rows).astype(np.int64)
            n += len(t)
            base_correct += int((top1 == t).sum())
            base_logp += float(logp.double().sum())
            starts = [rec.state(v[2]) for v in variants]
            for i, h in run_variants(model, rec, starts, [v[3] for v in variants], max_rows=max_rows):
                lp, tp = _scored(model.decode(h[sel]).float(), t, fused)
                acc = per_variant[i]
                acc[0] += int((tp == t).sum())
                acc[1] += int((tp == top1).sum())
                acc[2] += float(lp.double().sum())
                win_variant[i][lo:lo + n_rows] += np.bincount(rows, weights=(tp == t).cpu().numpy(),
                                                              minlength=n_rows).astype(np.int64)
                bar.update(1)
    finally:
        bar.close()
    return n, base_correct, base_logp, [tuple(v) for v in per_variant], win_n, win_base, win_variant
