"""Run a model's blocks from recorded inputs: the part of a forward pass after an intervention.

An intervention at block ``l`` (delete it, swap it with the next, steer its output) leaves every
block before ``l`` exactly as in the clean forward pass, so re-running that prefix for every variant
is wasted work. :func:`record_block_inputs` runs one clean forward and records what each block
receives — its hidden state *and* every other argument the model's own forward built for it
(attention mask, rotary position embeddings, position ids, ...); :func:`run_variants` then calls
the blocks directly from a recorded (or edited) state. Nothing is family-specific: the arguments
are the model's own, passed back unchanged, and a block's output is read as its first tensor
(:func:`lens.model.arch.taps.first_tensor`, as the capture taps read it).

Variants run stacked along the batch axis (fewer, larger block calls): a recorded argument whose
first axis is the batch (a tensor of ≥ 2 dimensions with ``batch`` rows) is repeated once per
variant; anything else (a ``(1, seq, ...)`` broadcast tensor, ``cache_position``, flags) is passed
as recorded. Each variant's blocks see their own recorded arguments (block k always gets what block
k got in the clean pass — as transformers' own loop does for families that pick a mask by the
block's type). :func:`check_replay` re-runs a clean pass from the recorded states and compares;
callers fall back to whole forward passes when a family's blocks cannot be replayed this way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from lens.model.arch.taps import first_tensor, input_tensor

__all__ = ["BlockInputs", "record_block_inputs", "run_variants", "run_chain", "check_replay", "record_checked"]


class _Stop(Exception):
    """Raised from a hook to end a recording forward pass early."""


@dataclass
class BlockInputs:
    """What blocks ``start .. stop-1`` received on one clean forward pass of ``batch`` rows.

    ``calls[k]`` = (args, kwargs) of block k as the model called it (its hidden state included);
    ``last`` = the output of block ``stop - 1`` (the state entering block ``stop``)."""

    start: int
    stop: int
    batch: int
    calls: dict
    last: torch.Tensor

    def state(self, k: int) -> torch.Tensor:
        """(batch, seq, d_model): the hidden state entering block ``k`` (``k == stop``: ``last``)."""
        if k == self.stop:
            return self.last
        args, kwargs = self.calls[k]
        return input_tensor(args, kwargs)


def _slot(args: tuple, kwargs: dict):
    """Where the hidden state sits among a block's arguments (the rule of :func:`input_tensor`)."""
    if args and isinstance(args[0], torch.Tensor):
        return ("arg", 0)
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return ("kw", "hidden_states")
    for i, v in enumerate(args):
        if isinstance(v, torch.Tensor):
            return ("arg", i)
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            return ("kw", k)
    raise RuntimeError("a block was called without a tensor argument: cannot replay it")


def _put(args: tuple, kwargs: dict, slot, value):
    kind, key = slot
    if kind == "arg":
        args = tuple(value if i == key else a for i, a in enumerate(args))
    else:
        kwargs = {**kwargs, key: value}
    return args, kwargs


def _repeat(obj, batch: int, n: int):
    """``obj`` with every batch-first tensor (≥ 2 dims, ``batch`` rows) repeated ``n`` times along
    axis 0 (variant-major: row ``v · batch + b``); containers are walked, anything else is kept."""
    if n == 1:
        return obj
    if isinstance(obj, torch.Tensor):
        if obj.dim() >= 2 and obj.shape[0] == batch:
            return obj.repeat(n, *([1] * (obj.dim() - 1)))
        return obj
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_repeat(v, batch, n) for v in obj)
    if isinstance(obj, list):
        return [_repeat(v, batch, n) for v in obj]
    if type(obj) is dict:
        return {k: _repeat(v, batch, n) for k, v in obj.items()}
    return obj


@torch.inference_mode()
def record_block_inputs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                        start: int = 0, stop: int | None = None) -> BlockInputs:
    """One clean forward of ``input_ids`` (batch, seq) that records the arguments of blocks
    ``start .. stop-1`` (default: to the last block) and the state entering block ``stop``; the pass
    ends there (no later block, final norm or unembedding runs)."""
    L = model.n_layers
    stop = L if stop is None else int(stop)
    if not 0 <= start <= stop <= L:
        raise ValueError(f"expected 0 <= start <= stop <= {L}, got start={start}, stop={stop}")
    blocks = model.layers
    calls, last = {}, []

    def pre(k):
        def hook(module, args, kwargs):
            if k == stop:  # the state entering block `stop` is all that is needed from here on
                last.append(input_tensor(args, kwargs).clone())
                raise _Stop
            slot = _slot(args, kwargs)
            h = input_tensor(args, kwargs).clone()  # kept while later blocks run: never aliased
            calls[k] = _put(tuple(args), dict(kwargs), slot, h)
        return hook

    def post(module, args, output):
        last.append(first_tensor(output).clone())
        raise _Stop

    handles = [blocks[k].register_forward_pre_hook(pre(k), with_kwargs=True) for k in range(start, min(stop + 1, L))]
    if stop == L:
        handles.append(blocks[L - 1].register_forward_hook(post))
    try:
        kwargs = dict(input_ids=input_ids.to(model.device), use_cache=False)
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(model.device)
        model.hf_model(**kwargs)
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    if not last:
        raise RuntimeError(f"{model.model_id}: the forward pass never reached block {stop}: cannot replay it")
    return BlockInputs(start=start, stop=stop, batch=int(input_ids.shape[0]), calls=calls, last=last[0])


def _block(model, rec: BlockInputs, k: int, h: torch.Tensor, cache: dict) -> torch.Tensor:
    n = h.shape[0] // rec.batch
    if (k, n) not in cache:
        args, kwargs = rec.calls[k]
        slot = _slot(args, kwargs)
        args, kwargs = _put(args, kwargs, slot, None)  # the recorded state is never repeated
        cache[(k, n)] = (slot, _repeat(args, rec.batch, n), _repeat(kwargs, rec.batch, n))
    slot, args, kwargs = cache[(k, n)]
    args, kwargs = _put(args, kwargs, slot, h)
    return first_tensor(model.layers[k](*args, **kwargs))


@torch.inference_mode()
def run_variants(model, rec: BlockInputs, starts: Sequence[torch.Tensor], chains: Sequence[Sequence[int]], *,
                 max_rows: int = 8192) -> Iterator[tuple[int, torch.Tensor]]:
    """Run each variant ``i``: state ``starts[i]`` (batch, seq, d_model) through the blocks
    ``chains[i]`` in that order; yields ``(i, final state)`` as each finishes.

    Chains are aligned at their ends and, at each step, the variants that call the same block are
    stacked into one call of at most ``max_rows`` token rows (at least one variant). Variants are
    run in waves of that many, longest chains first, so memory holds one wave's states."""
    cache: dict = {}
    seq = int(starts[0].shape[1]) if len(starts) else 1
    per_wave = max(1, int(max_rows) // max(1, rec.batch * seq))
    order = sorted(range(len(starts)), key=lambda i: -len(chains[i]))
    for lo in range(0, len(order), per_wave):
        wave = order[lo:lo + per_wave]
        state = {i: starts[i] for i in wave}
        n_steps = max(len(chains[i]) for i in wave)
        for step in range(n_steps):
            by_block: dict = {}
            for i in wave:
                j = len(chains[i]) - (n_steps - step)
                if j >= 0:
                    by_block.setdefault(int(chains[i][j]), []).append(i)
            for k, members in by_block.items():
                x = state[members[0]] if len(members) == 1 else torch.cat([state[i] for i in members])
                y = _block(model, rec, k, x, cache)
                for v, i in enumerate(members):
                    state[i] = y[v * rec.batch:(v + 1) * rec.batch]
        for i in wave:
            yield i, state.pop(i)


@torch.inference_mode()
def run_chain(model, rec: BlockInputs, state: torch.Tensor, chain: Sequence[int]) -> Iterator[tuple[int, torch.Tensor]]:
    """Run ``state`` (batch, seq, d_model) through the blocks ``chain`` in order, one variant; yields
    ``(k, state after block k)`` at every block — what a measure of each later block's update needs
    (:mod:`lens.interventions.depth_use`), where :func:`run_variants` gives the final state only."""
    cache: dict = {}
    for k in chain:
        state = _block(model, rec, int(k), state, cache)
        yield int(k), state


def check_replay(model, rec: BlockInputs, *, start: int | None = None, copies: int = 2) -> float:
    """Replay the clean pass from the state entering block ``start`` (default ``rec.start``),
    ``copies`` variants stacked, through the recorded blocks; the largest difference from the
    recorded final state, relative to its largest magnitude (about 1e-6 in float32 when replay works)."""
    start = rec.start if start is None else start
    chain = list(range(start, rec.stop))
    ref = rec.last.float()
    worst = 0.0
    for _, out in run_variants(model, rec, [rec.state(start)] * copies, [chain] * copies,
                               max_rows=copies * rec.batch * int(ref.shape[1])):
        worst = max(worst, float((out.float() - ref).abs().max()))
    return worst / max(float(ref.abs().max()), 1e-30)


def replay_tolerance(dtype: torch.dtype) -> float:
    """Relative difference :func:`check_replay` accepts: rounding, never a wrong mask or position."""
    return 1e-3 if dtype in (torch.float32, torch.float64) else 5e-2


def record_checked(model, input_ids, attention_mask=None, *, start: int = 0) -> tuple[BlockInputs | None, str | None]:
    """:func:`record_block_inputs`, then :func:`check_replay`: ``(recording, None)``, or ``(None, why
    the model's blocks cannot be replayed)`` — a recording or a stacked block call that fails counts
    (BLOOM's ALiBi bias has batch × heads rows, which are not repeated), as does a replay that
    differs from the forward pass beyond rounding."""
    try:
        rec = record_block_inputs(model, input_ids, attention_mask, start=start)
        err = check_replay(model, rec)
    except Exception as exc:  # noqa: BLE001 — any failure: the caller runs whole forward passes
        return None, f"replaying its blocks failed ({type(exc).__name__}: {exc})"
    if not err <= replay_tolerance(model.dtype):
        return None, f"replaying its blocks differs from the forward pass (relative {err:.2g})"
    return rec, None
