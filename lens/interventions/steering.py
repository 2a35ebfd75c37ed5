"""Steering along a 1-D direction: set the residual state's coordinate along ``direction`` to a value.

Minder et al. (2025, "Controllable Context Sensitivity and the Knob Behind It") find a 1-D subspace
in one layer whose coordinate decides whether the model answers from the context or from memory;
steering sets that coordinate: h ← h + (value − h·u) u with u the unit direction, on the output of
block ``layer`` (``resid_post``), at every position or only at given positions (e.g. each prompt's
last token). The hook is removed on exit, even after an exception; parameters are never touched.

``next_token_logits`` runs a batch of prompts (right-padded) and returns each prompt's last-token
logits — the quantity steering and context-aware decoding act on. ``steering_sweep`` scores many
steering values without a whole forward pass per value: only the last token again, against the
prompts' KV cache (:mod:`lens.interventions.prefix_cache`), or the blocks after the steered one from recorded
inputs (:mod:`lens.interventions.replay`), each checked against whole forward passes.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Sequence

import numpy as np
import torch

from lens.capturing.batches import pad_id, padded_tensors
from lens.errors import LensInputError
from lens.interventions.replay import record_block_inputs, record_checked, run_variants
from lens.interventions.prefix_cache import PrefixCache
from lens.runtime.precision import matmul_precision

__all__ = ["steer", "next_token_logits", "steering_sweep", "steering_sweeps", "SWEEP_METHODS"]

log = logging.getLogger(__name__)


def _unit(direction, d_model: int, device, dtype) -> torch.Tensor:
    u = torch.as_tensor(np.asarray(direction, dtype=np.float64) if not torch.is_tensor(direction) else direction)
    if u.ndim != 1 or u.shape[0] != d_model:
        raise LensInputError(f"direction: expected a vector of length d_model={d_model}, got shape {tuple(u.shape)}")
    nrm = float(u.double().norm())
    if not np.isfinite(nrm) or nrm == 0:
        raise LensInputError("direction: expected a finite non-zero vector")
    return (u.double() / nrm).to(device=device, dtype=dtype)


@contextmanager
def steer(model, layer: int, direction, value: float, positions: "torch.Tensor | Sequence[int] | None" = None):
    """Within the block, block ``layer``'s output has coordinate ``value`` along ``direction``.

    ``positions``: None steers every position; else one position per batch row (e.g. the last real
    token of each right-padded prompt)."""
    n = model.n_layers
    if not isinstance(layer, (int, np.integer)) or not 0 <= int(layer) < n:
        raise LensInputError(f"layer: expected a block index in 0..{n - 1}, got {layer!r}")
    if not np.isfinite(float(value)):
        raise LensInputError(f"value: expected a finite number, got {value!r}")
    u = _unit(direction, model.d_model, model.device, model.dtype)
    pos = None if positions is None else torch.as_tensor(list(positions) if not torch.is_tensor(positions)
                                                         else positions, dtype=torch.long)

    def hook(module, args, output):
        h = output[0] if isinstance(output, (tuple, list)) else output
        if pos is None:
            h = h + (float(value) - h @ u).unsqueeze(-1) * u
        else:
            if pos.shape[0] != h.shape[0]:
                raise LensInputError(f"positions: expected one per batch row ({h.shape[0]}), got {pos.shape[0]}")
            h = h.clone()
            rows = torch.arange(h.shape[0], device=h.device)
            sel = h[rows, pos.to(h.device)]
            h[rows, pos.to(h.device)] = sel + (float(value) - sel @ u).unsqueeze(-1) * u
        if isinstance(output, tuple):
            return (h,) + tuple(output[1:])
        if isinstance(output, list):
            return [h] + list(output[1:])
        return h

    handle = model.layers[int(layer)].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@torch.inference_mode()
def next_token_logits(model, prompts: Sequence[str], *, batch_size: int = 16, steering: dict | None = None,
                      add_special_tokens: bool = False) -> torch.Tensor:
    """(prompt, d_vocab) float32 logits at each prompt's last token. ``steering``: keyword arguments
    of :func:`steer` without ``positions`` (the last token of each prompt is steered)."""
    if not model.has_lm_head:
        raise LensInputError(f"{model.model_id} has no language-model head: next-token logits need a causal LM")
    ids = _prompt_ids(model, prompts, add_special_tokens)
    pad = pad_id(model.tokenizer)
    out = []
    for lo in range(0, len(ids), batch_size):
        chunk = ids[lo:lo + batch_size]
        x, mask = padded_tensors(chunk, pad)
        last = torch.as_tensor([len(c) - 1 for c in chunk])
        kwargs = dict(input_ids=x.to(model.device), attention_mask=mask.to(model.device), use_cache=False)
        # the base model's output is already final-normed; unembedding only the last positions
        # saves a (seq, d_vocab) product per prompt (most of the cost for a 49k vocabulary)
        base = model.hf_model.base_model
        if steering:
            with steer(model, positions=last, **steering):
                h = base(**kwargs).last_hidden_state
        else:
            h = base(**kwargs).last_hidden_state
        logits = model.unembed(h[torch.arange(len(chunk)), last.to(h.device)])
        out.append(logits.float().cpu())
    return torch.cat(out)


def _prompt_ids(model, prompts, add_special_tokens):
    ids = [model.tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"] for p in prompts]
    if not ids or any(len(x) == 0 for x in ids):
        raise LensInputError("expected at least one non-empty prompt")
    return ids


SWEEP_METHODS = ("auto", "cache", "replay", "forward")


@torch.inference_mode()
def _sweep_args(model, prompts, layer, values, token_ids, method: str) -> tuple[int, list[float], torch.Tensor]:
    """:func:`steering_sweep`'s arguments checked: (block index, values as floats, token ids (prompt, k))."""
    if not model.has_lm_head:
        raise LensInputError(f"{model.model_id} has no language-model head: next-token logits need a causal LM")
    if method not in SWEEP_METHODS:
        raise LensInputError(f"method: expected one of {', '.join(SWEEP_METHODS)}, got {method!r}")
    n = model.n_layers
    if not isinstance(layer, (int, np.integer)) or not 0 <= int(layer) < n:
        raise LensInputError(f"layer: expected a block index in 0..{n - 1}, got {layer!r}")
    values = [float(v) for v in values]
    if not all(np.isfinite(values)):
        raise LensInputError(f"values: expected finite numbers, got {values}")
    cols = torch.as_tensor(np.asarray(token_ids, dtype=np.int64))
    if cols.ndim != 2 or cols.shape[0] != len(prompts):
        raise LensInputError(f"token_ids: expected (prompt, k) = ({len(prompts)}, k), got {tuple(cols.shape)}")
    return int(layer), values, cols


def steering_sweep(model, prompts: Sequence[str], layer: int, direction, values: Sequence[float], *,
                   token_ids: np.ndarray, batch_size: int = 16, max_rows: int = 8192, method: str = "auto",
                   add_special_tokens: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Next-token logits of ``token_ids`` (prompt, k) at each prompt's last token, unsteered and with
    the last token's coordinate along ``direction`` at block ``layer``'s output set to each of
    ``values`` (:func:`lens.interventions.steering.steer`): ``(base (prompt, k), steered (value, prompt, k))`` float32.

    Steering the last token changes nothing at earlier positions, nor anything before block
    ``layer + 1``. ``method``:

    * ``"cache"``: each batch's prefixes run once with the model's KV cache, then only the last
      token, through every block, once unsteered and once per value (:mod:`lens.interventions.prefix_cache`) —
      a 1 / prompt-length share of a forward pass per value;
    * ``"replay"``: one recording forward per batch, then the blocks after ``layer`` from the
      recorded state for every value, values stacked into calls of ``max_rows`` token rows
      (:mod:`lens.interventions.replay`);
    * ``"forward"``: a whole forward pass per value, as :func:`lens.interventions.steering.next_token_logits` runs it;
    * ``"auto"`` (default): the first of these that reproduces whole forward passes on the first
      batch (checked in float32, whatever :func:`lens.runtime.precision.matmul_precision` block is open;
      a family without a croppable KV cache, or whose blocks do not replay, falls through).
    ``"cache"`` and ``"replay"`` raise when their check fails."""
    base, (swept,) = steering_sweeps(model, prompts, [(layer, direction, values)], token_ids=token_ids,
                                     batch_size=batch_size, max_rows=max_rows, method=method,
                                     add_special_tokens=add_special_tokens)
    return base, swept


def steering_sweeps(model, prompts: Sequence[str], sweeps: Sequence[tuple], *, token_ids: np.ndarray,
                    batch_size: int = 16, max_rows: int = 8192, method: str = "auto",
                    add_special_tokens: bool = False) -> tuple[np.ndarray, list[np.ndarray]]:
    """:func:`steering_sweep` for several sweeps ``(layer, direction, values)`` of the same prompts:
    ``(base (prompt, k), [steered (value, prompt, k) per sweep])``, each sweep's numbers those
    :func:`steering_sweep` gives it alone. With the ``"cache"`` method every batch's prefixes run once
    for all the sweeps (the KV cache does not depend on where the last token is steered)."""
    checked = [_sweep_args(model, prompts, layer, values, token_ids, method) for layer, _, values in sweeps]
    if not checked:
        raise LensInputError("sweeps: expected at least one (layer, direction, values)")
    cols = checked[0][2]
    plan = [(layer, direction, values) for (layer, values, _), (_, direction, _) in zip(checked, sweeps)]

    def pick(logits, rows):
        return logits.float().cpu().gather(1, cols[rows]).numpy()

    if method != "forward":
        ids = _prompt_ids(model, prompts, add_special_tokens)
    if method in ("auto", "cache"):
        got = _sweep_cached(model, prompts, ids, plan, pick, cols.shape[1], batch_size, add_special_tokens,
                            strict=method == "cache")
        if got is not None:  # (a strict sweep raises instead of returning None)
            return got
    base, swept = None, []
    for layer, direction, values in plan:
        if method == "forward":
            b, s = _sweep_forward(model, prompts, layer, direction, values, pick, batch_size, add_special_tokens)
        else:
            b, s = _sweep_replay(model, prompts, ids, layer, direction, values, pick, cols.shape[1], batch_size,
                                 max_rows, strict=method == "replay", add_special_tokens=add_special_tokens)
        base = b if base is None else base
        swept.append(s)
    return base, swept


def _sweep_forward(model, prompts, layer, direction, values, pick, batch_size, add_special_tokens):
    """The ``"forward"`` method of :func:`steering_sweep`: a whole forward pass per value."""
    kw = dict(batch_size=batch_size, add_special_tokens=add_special_tokens)
    all_rows = np.arange(len(prompts))
    base = pick(next_token_logits(model, prompts, **kw), all_rows)
    swept = [pick(next_token_logits(model, prompts, steering=dict(layer=layer, direction=direction, value=v), **kw),
                  all_rows) for v in values]
    return base, np.stack(swept) if swept else np.zeros((0, *base.shape), np.float32)


def _sweep_replay(model, prompts, ids, layer, direction, values, pick, n_cols, batch_size, max_rows, strict,
                  add_special_tokens):
    """The ``"replay"`` method of :func:`steering_sweep`; whole forward passes (logged) when the
    first batch does not replay and not ``strict``."""
    n = model.n_layers
    u = _unit(direction, model.d_model, model.device, model.dtype)
    pad = pad_id(model.tokenizer)
    base = np.zeros((len(prompts), n_cols), np.float32)
    swept = np.zeros((len(values), *base.shape), np.float32)
    chain = list(range(layer + 1, n))
    for lo in range(0, len(ids), batch_size):
        chunk = ids[lo:lo + batch_size]
        rows = np.arange(lo, lo + len(chunk))
        x, mask = padded_tensors(chunk, pad)  # right padding, as next_token_logits pads
        last = torch.as_tensor([len(c) - 1 for c in chunk], device=model.device)
        ar = torch.arange(len(chunk), device=model.device)
        if lo == 0 and chain:  # the first batch checks that this family's blocks replay
            rec, problem = record_checked(model, x, mask, start=layer + 1)
        else:
            rec, problem = record_block_inputs(model, x, mask, start=layer + 1), None
        if problem:
            if strict:
                raise RuntimeError(f"{model.model_id}: {problem}")
            log.warning("%s: %s; the steering sweep runs whole forward passes instead", model.model_id, problem)
            return _sweep_forward(model, prompts, layer, direction, values, pick, batch_size, add_special_tokens)
        base[rows] = pick(model.decode(rec.last[ar, last]), rows)
        starts = []
        for v in values:  # the steer() edit, on the state entering block layer + 1
            h = rec.state(layer + 1).clone()
            sel = h[ar, last]
            h[ar, last] = sel + (v - sel @ u).unsqueeze(-1) * u
            starts.append(h)
        for i, h in run_variants(model, rec, starts, [chain] * len(values), max_rows=max_rows):
            swept[i, rows] = pick(model.decode(h[ar, last]), rows)
    return base, swept


@torch.inference_mode()
def _sweep_cached(model, prompts, ids, plan, pick, n_cols, batch_size, add_special_tokens, strict):
    """The ``"cache"`` method of :func:`steering_sweeps` (``plan``: its sweeps checked); None (logged)
    when it cannot stand in for whole forward passes (checked on the first batch) and not ``strict``."""
    def refuse(problem):
        if strict:
            raise RuntimeError(f"{model.model_id}: {problem}")
        log.info("%s: %s; the steering sweep replays the blocks instead", model.model_id, problem)

    if min(len(c) for c in ids) < 2:
        return refuse("a one-token prompt has no prefix to cache")

    def logits(pc, layer, direction, value):
        if value is None:
            return model.unembed(pc.last_state())
        with steer(model, layer, direction, value, positions=zero):
            return model.unembed(pc.last_state())

    base = np.zeros((len(ids), n_cols), np.float32)
    swept = [np.zeros((len(values), len(ids), n_cols), np.float32) for _, _, values in plan]
    for lo in range(0, len(ids), batch_size):
        chunk = ids[lo:lo + batch_size]
        rows = np.arange(lo, lo + len(chunk))
        zero = torch.zeros(len(chunk), dtype=torch.long)
        if lo == 0:
            problem = _cache_problem(model, prompts[:len(chunk)], chunk, plan, logits, add_special_tokens)
            if problem:
                return refuse(problem)
        pc = PrefixCache(model, chunk)
        base[rows] = pick(logits(pc, None, None, None), rows)
        for (layer, direction, values), out in zip(plan, swept):
            for i, v in enumerate(values):
                out[i, rows] = pick(logits(pc, layer, direction, v), rows)
    return base, swept


# the cached last-token step must match whole forward passes to float32 reordering: |Δ logit| at most
# this share of the largest |logit| (measured on 16 knob prompts of SmolLM2: 3.5e-5 on logits up to 19,
# 2e-6 of the largest; a wrong position or mask is ≫ 1e-2)
CACHE_TOLERANCE = 1e-4


def _cache_problem(model, prompts, chunk, plan, logits, add_special_tokens) -> str | None:
    """Why the cached step cannot stand in for whole forward passes on this batch (None: it can):
    unsteered and at the first sweep's largest value, in float32 (the other sweeps run the same step under
    the same hook; each probe costs a float32 forward pass of the batch)."""
    probe = [(None, None, None)] + [(layer, direction, max(values, key=abs)) for layer, direction, values in plan
                                    if values][:1]
    kw = dict(batch_size=len(chunk), add_special_tokens=add_special_tokens)
    try:
        with matmul_precision("float32", model.device):
            pc = PrefixCache(model, chunk)
            got = [logits(pc, *p).float().cpu() for p in probe]
            ref = [next_token_logits(model, prompts, **kw, **({} if v is None else
                                                              {"steering": dict(layer=layer, direction=direction,
                                                                                value=v)}))
                   for layer, direction, v in probe]
    except Exception as exc:  # noqa: BLE001 - a family whose model has no such cache: fall back
        return f"no cached last-token step ({type(exc).__name__}: {exc})"
    err = max(float((g - r).abs().max()) for g, r in zip(got, ref))
    scale = max(float(r.abs().max()) for r in ref)
    if not err <= CACHE_TOLERANCE * max(1.0, scale):
        return f"the cached last-token step differs from whole forward passes by {err:.3g} (logits up to {scale:.3g})"
    return None
