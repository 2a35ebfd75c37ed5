"""Fitting the Jacobian lens (:mod:`lens.readout.jacobian_lens`): sums of per-prompt Jacobians, by parts and ranks.

Per prompt (the reference's ``jacobian_for_prompt``): one forward pass of the prompt replicated ``dim_batch``
times, with forward hooks on the blocks recording their outputs (the first fitted block's output is made the
root of the graph, so the parameters need no gradient), then ``ceil(d_model / dim_batch)`` backward passes
through the retained graph: batch element ``b`` carries the one-hot cotangent of output dimension
``start + b`` at every valid position, so each pass is ``dim_batch`` vector-Jacobian products and gives
``dim_batch`` rows of every ``J_l`` at once. The forward stops at the last block (its hook ends it): the final
norm and the unembedding are not run. Gradients are taken in the model's dtype and accumulated in float64.

Cost: one forward and ``d_model`` single-sequence backwards per prompt (a backward over ``dim_batch`` copies
per pass); ``benchmarks/jacobian_lens.py`` measures it against one forward + backward of the same batch.

Parts: prompt ``k`` of ``P`` belongs to part ``i`` of ``N`` when ``floor((i-1) P / N) <= k < floor(i P / N)``
(:func:`part_range`); under torchrun rank ``r`` takes part ``r + 1`` of ``WORLD_SIZE`` and :func:`all_reduce`
sums the parts (gloo on the CPU, NCCL on GPUs).
"""

from __future__ import annotations

import hashlib
import logging
from contextlib import contextmanager
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from lens.errors import LensInputError
from lens.readout.tuned_lens import frozen_parameters
from lens.readout.jacobian_lens import MAX_SEQ_LEN, SKIP_FIRST, JacobianSettings, JacobianSums

log = logging.getLogger(__name__)


class StopForward(Exception):
    """Raised by the last block's hook: nothing after it is needed."""


def prompt_digest(ids) -> str:
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]


def fitted_digests(prompts: Sequence, settings: JacobianSettings) -> list[str]:
    """The digests of the prompts a fit of ``prompts`` counts (those long enough to have a valid position), in order."""
    out = []
    for ids in prompts:
        ids = np.asarray(ids, dtype=np.int64)[: settings.max_seq_len]
        if ids.size - 1 > settings.skip_first:
            out.append(prompt_digest(ids))
    return out


def part_range(n_prompts: int, part) -> tuple[int, int]:
    """Prompts ``[start, end)`` of part ``part`` (a :class:`lens.store.parts.Part`, 1-based) of ``n_prompts``."""
    if part is None:
        return 0, n_prompts
    if part.count > n_prompts:
        raise LensInputError(f"--part {part.label}: {n_prompts} prompts cannot be split into {part.count} parts")
    return (part.index - 1) * n_prompts // part.count, part.index * n_prompts // part.count


def settings_for(model, layers: Sequence[int] | None = None, skip_first: int = SKIP_FIRST,
                 max_seq_len: int = MAX_SEQ_LEN) -> JacobianSettings:
    L = int(model.n_layers)
    if L < 2:
        raise LensInputError(f"the Jacobian lens needs at least 2 layers; {getattr(model, 'model_id', 'the model')} "
                             f"has {L}")
    layers = tuple(range(L - 1)) if layers is None else tuple(sorted({int(l) for l in layers}))
    if not layers or layers[0] < 0 or layers[-1] >= L - 1:
        raise LensInputError(f"Jacobian-lens layers must lie in 0..{L - 2} (layer {L - 1} is the last: J = I); "
                             f"got {list(layers)}")
    if skip_first < 0 or max_seq_len < skip_first + 2:
        raise LensInputError(f"need skip_first >= 0 and max_seq_len >= skip_first + 2; got {skip_first}, {max_seq_len}")
    scales = getattr(getattr(model, "site_map", None), "scales", {}) or {}
    if any(getattr(s, "value", s) == "resid_post" for s in scales):
        raise LensInputError(f"{model.model_id} rescales its residual stream between blocks: a block's output is "
                             "not resid_post there, and the Jacobian lens is not supported")
    return JacobianSettings(model_id=getattr(model, "model_id", ""), revision=getattr(model, "revision", ""),
                            n_layers=L, d_model=int(model.d_model), layers=layers, skip_first=int(skip_first),
                            max_seq_len=int(max_seq_len),
                            model_dtype=str(next(model.hf_model.parameters()).dtype).replace("torch.", ""))


@contextmanager
def _recording(blocks, at: Sequence[int], root: int, last: int):
    """Forward hooks recording the output of ``blocks[i]`` for ``i`` in ``at``; ``root``'s output becomes the
    graph's root, ``last``'s hook stops the forward."""
    acts: dict[int, torch.Tensor] = {}

    def hook_for(i):
        def hook(module, inputs, output):
            t = output if torch.is_tensor(output) else output[0]
            if i == root:
                t.requires_grad_(True)
            acts[i] = t
            if i == last:
                raise StopForward

        return hook

    handles = [blocks[i].register_forward_hook(hook_for(i)) for i in sorted(set(at))]
    try:
        yield acts
    finally:
        for h in handles:
            h.remove()


def prompt_jacobians(model, ids, settings: JacobianSettings, dim_batch: int = 8) -> tuple[torch.Tensor | None, int]:
    """The per-prompt estimator (layer, d_out, d_in) float64 of one prompt's token ids (module docstring of
    :mod:`lens.readout.jacobian_lens`), and its number of valid positions; (None, 0) for a prompt too short."""
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))[: settings.max_seq_len]
    T, d = int(ids.numel()), settings.d_model
    valid = torch.arange(settings.skip_first, T - 1)
    if valid.numel() == 0:
        return None, 0
    layers, last = list(settings.layers), settings.n_layers - 1
    B = max(1, min(int(dim_batch), d))
    out = torch.zeros(len(layers), d, d, dtype=torch.float64)
    device = model.device
    batch = ids.to(device)[None].expand(B, -1)
    with frozen_parameters(model.hf_model), torch.enable_grad(), _recording(model.layers, [*layers, last], layers[0], last) as acts:
        try:
            model.hf_model(input_ids=batch, use_cache=False)
        except StopForward:
            pass
        final = acts[last]
        sources = [acts[l] for l in layers]
        if final.shape != (B, T, d):
            raise LensInputError(f"the last block's output has shape {tuple(final.shape)}, expected {(B, T, d)}")
        cot = torch.zeros_like(final)
        rows = torch.arange(B, device=final.device)
        pos = valid.to(final.device)
        starts = list(range(0, d, B))
        for k, start in enumerate(starts):
            n = min(B, d - start)
            cot.zero_()
            cot[rows[:n, None], pos[None, :], (start + rows[:n])[:, None]] = 1.0
            grads = torch.autograd.grad(final, sources, grad_outputs=cot, retain_graph=k < len(starts) - 1)
            for i, g in enumerate(grads):
                out[i, start:start + n] = g[:n, pos.to(g.device)].double().mean(1).cpu()
            del grads
    return out, int(valid.numel())


def fit_sums(model, prompts: Sequence, settings: JacobianSettings | None = None, *, dim_batch: int = 8,
             part=None, corpus: str = "", progress: bool = False) -> JacobianSums:
    """Sums of the per-prompt estimators over ``prompts`` (token-id arrays, one per prompt; those of ``part`` only
    when given, :func:`part_range`)."""
    settings = settings or settings_for(model)
    if int(model.d_model) != settings.d_model or int(model.n_layers) != settings.n_layers:
        raise LensInputError(f"settings for {settings.n_layers} layers of width {settings.d_model}; the model has "
                             f"{model.n_layers} of width {model.d_model}")
    if dim_batch < 1:
        raise LensInputError(f"dim_batch must be >= 1; got {dim_batch}")
    lo, hi = part_range(len(prompts), part)
    acc = JacobianSums.empty(settings, corpus)
    acc.parts = [part.label] if part is not None and part.count > 1 else []
    model.hf_model.eval()
    for ids in tqdm(prompts[lo:hi], desc="jacobian lens", unit="prompt", disable=not progress):
        ids = np.asarray(ids, dtype=np.int64)[: settings.max_seq_len]
        J, n_valid = prompt_jacobians(model, ids, settings, dim_batch)
        if J is None:
            acc.skipped += 1
            continue
        if not torch.isfinite(J).all():
            raise LensInputError(f"a non-finite Jacobian on prompt {prompt_digest(ids)} (model in a low precision?)")
        acc.sums += J
        acc.n_prompts += 1
        acc.n_positions += n_valid
        acc.digests.append(prompt_digest(ids))
    return acc


def all_reduce(sums: JacobianSums, all_digests: Sequence[str]) -> JacobianSums:
    """Every rank's sums added (``torch.distributed.all_reduce`` on the float64 sums and the counts; the process
    group must be initialised). ``all_digests``: the digests of every rank's prompts, in part order (each rank
    knows the whole prompt list, so no object is exchanged)."""
    world = dist.get_world_size()
    backend = dist.get_backend()
    device = "cuda" if backend == "nccl" else "cpu"
    s = sums.sums.to(device)
    counts = torch.tensor([sums.n_prompts, sums.n_positions, sums.skipped], dtype=torch.float64, device=device)
    dist.all_reduce(s)
    dist.all_reduce(counts)
    n_prompts, n_positions, skipped = (int(round(float(c))) for c in counts.cpu())
    if n_prompts != len(all_digests):
        raise LensInputError(f"the ranks fitted {n_prompts} prompts, expected {len(all_digests)}")
    return JacobianSums(sums.settings, s.cpu(), n_prompts, n_positions, list(all_digests),
                        [] if world > 1 else list(sums.parts), sums.corpus, skipped)
