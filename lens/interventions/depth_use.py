"""How much each block uses of its depth: the size of its update relative to the residual, and what skipping it
changes downstream (Csordás, Manning & Potts, NeurIPS 2025, "Do Language Models Use Their Depth Efficiently?",
reference code ``robertcsordas/llm_effective_depth``: ``analyze_norms.py`` and ``analyze_future_effects.py``).

Conventions (the reference code's, 0-based blocks): ``h_l`` is the input of block ``l`` (``resid_pre``), its
output ``h_{l+1}`` (``resid_post``), ``resid_mid`` the state between its attention and its MLP, so in a sequential
pre-norm or sandwich block ``a_l = resid_mid - h_l`` and ``m_l = resid_post - resid_mid``. Per token:

- ``rel_layer`` = ||h_{l+1} − h_l|| / ||h_l||   (the reference's "Attention + MLP: ||a_l + m_l|| / ||h_l||")
- ``rel_attn``  = ||a_l|| / ||h_l||
- ``rel_mlp``   = ||m_l|| / ||h_l + a_l||       (the MLP reads h_l + a_l, not h_l)

A family without ``resid_mid`` (parallel attention and MLP: GPT-J, NeoX, Falcon, Phi; state-space blocks) has
no attention and MLP parts in this sense: they are absent, with the reason, never read from a neighbour.

Skipping block ``l`` (its input passed on as its output, at every position — the reference's Fig. 3 skips it
at the positions before a cut t and reads the positions after; ours is the whole-sequence deletion of
:func:`lens.interventions.ablation.delete_layer`): for every later block ``k > l`` the relative change of its
update, ||Δ'_k − Δ_k|| / ||Δ_k|| with Δ_k = h_{k+1} − h_k, averaged over tokens (the reference takes the
maximum over tokens; a mean is what a resample of documents can average), and the change of the output
cross-entropy to the true next token. Blocks are replayed from one recorded clean pass
(:mod:`lens.interventions.replay`); a family whose blocks do not replay runs whole forward passes under
:func:`lens.interventions.ablation.delete_layer` (the reference the replay is tested against).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from lens.capturing.backends import make_backend
from lens.errors import LensInputError
from lens.interventions.ablation import _padded, delete_layer
from lens.interventions.replay import record_block_inputs, record_checked, run_chain
from lens.sites import HookSite, Site

log = logging.getLogger(__name__)

_EPS = 1e-12


@dataclass(frozen=True)
class DepthUseResult:
    """Axis ``layer``: blocks 0..L-1; axis ``token``: every real position of every window, windows in the order
    given (``token_window``: the window of each); ``skipped``: the block skipped (0..L-1).

    ``rel_layer`` / ``rel_attn`` / ``rel_mlp`` (layer, token): the relative updates of the module docstring
    (``rel_attn`` / ``rel_mlp`` None where ``parts_absent`` says why). ``skip_effect`` (skipped, layer): mean over
    tokens of the relative change of block k's update with block l skipped (NaN for k ≤ l); ``skip_effect_window``
    (skipped, layer, window): its per-window sums (counts in ``window_n_tokens``). ``skip_nll_window``
    (skipped, window) and ``base_nll_window`` (window): summed negative log-likelihood of the true next token
    over each window's scored positions (``window_n_scored``); ``skip_delta_ce`` (skipped): mean CE change."""

    layers: np.ndarray
    rel_layer: np.ndarray
    rel_attn: np.ndarray | None
    rel_mlp: np.ndarray | None
    parts_absent: str
    token_window: np.ndarray
    token_position: np.ndarray
    skip_effect: np.ndarray
    skip_effect_window: np.ndarray
    window_n_tokens: np.ndarray
    skip_delta_ce: np.ndarray
    skip_nll_window: np.ndarray
    base_nll_window: np.ndarray
    window_n_scored: np.ndarray
    base_ce: float
    replayed: bool


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return num.float().norm(dim=-1) / den.float().norm(dim=-1).clamp_min(_EPS)


def _nll(model, final: torch.Tensor, sel: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of the targets ``t`` at the positions ``sel`` of the final states."""
    logits = model.decode(final[sel]).float()
    return -(logits.log_softmax(-1).gather(1, t[:, None])[:, 0]).double()


def _sum_by_row(values: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """Per batch row: the sum of ``values`` (batch, seq) over ``mask``."""
    return (values.double() * mask).sum(1).cpu().numpy()


def depth_use_scan(model, windows: Sequence[np.ndarray], targets: Sequence[np.ndarray], *, batch_size: int = 8,
                   skip: bool = True, replay: bool | None = None, progress: bool = False) -> DepthUseResult:
    """Relative updates per block and token, and (``skip``) the effect of skipping each block on every later
    block's update and on the output cross-entropy, over ``windows`` (token ids) with next-token ``targets``
    (-1: not scored). ``replay``: None = replay blocks when they replay (checked on the first batch), False =
    whole forward passes (the reference path)."""
    if not model.has_lm_head:
        raise LensInputError(f"{model.model_id} has no language-model head: depth use reads the output "
                             "cross-entropy and needs a causal LM")
    if len(windows) != len(targets):
        raise LensInputError(f"expected one target array per window; got {len(windows)} windows, {len(targets)}")
    L = model.n_layers
    site_map = model.site_map
    has_mid = Site.RESID_MID in site_map.taps
    parts_absent = "" if has_mid else (
        f"absent: {model.model_id} has no resid_mid ({site_map.absent.get(Site.RESID_MID, 'not mapped')}), so no "
        "attention and MLP parts of an update")
    hooks = [HookSite(Site.RESID_PRE, l) for l in range(L)] + [HookSite(Site.RESID_POST, l) for l in range(L)]
    if has_mid:
        hooks += [HookSite(Site.RESID_MID, l) for l in range(L)]
    engine = make_backend("native", model, hooks)
    W = len(windows)
    rel = {k: [] for k in ("layer", "attn", "mlp")}
    tok_win, tok_pos = [], []
    eff_win = np.zeros((L, L, W))
    n_win = np.zeros(W)
    nll_win = np.zeros((L, W))
    base_win = np.zeros(W)
    scored_win = np.zeros(W)
    use_replay = replay
    bar = tqdm(total=-(-W // batch_size), desc="depth use", unit="batch", disable=not progress)
    for lo in range(0, W, batch_size):
        ids, att, tgt = _padded(model, windows[lo:lo + batch_size], targets[lo:lo + batch_size])
        ids, att = ids.to(model.device), att.to(model.device)
        real = att.bool()
        with torch.inference_mode():
            states, _ = engine.run(ids, att)
        pre = [states[HookSite(Site.RESID_PRE, l).key] for l in range(L)]
        post = [states[HookSite(Site.RESID_POST, l).key] for l in range(L)]
        rows = real.nonzero()
        for l in range(L):
            rel["layer"].append(_ratio(post[l] - pre[l], pre[l])[real].double().cpu().numpy())
            if has_mid:
                mid = states[HookSite(Site.RESID_MID, l).key]
                rel["attn"].append(_ratio(mid - pre[l], pre[l])[real].double().cpu().numpy())
                rel["mlp"].append(_ratio(post[l] - mid, mid)[real].double().cpu().numpy())
        tok_win.append(lo + rows[:, 0].cpu().numpy())
        tok_pos.append(rows[:, 1].cpu().numpy())
        b = ids.shape[0]
        n_win[lo:lo + b] += real.sum(1).cpu().numpy()
        sel = (tgt >= 0).to(model.device) & real
        t = tgt.to(model.device)[sel]
        scored_win[lo:lo + b] += sel.sum(1).cpu().numpy()
        if skip:
            row_of = sel.nonzero()[:, 0].cpu().numpy()
            with torch.inference_mode():
                base = _nll(model, post[L - 1], sel, t).cpu().numpy()
                base_win[lo:lo + b] += np.bincount(row_of, weights=base, minlength=b)
                use_replay = _skip_batch(model, ids, att, real, sel, t, row_of, eff_win[:, :, lo:lo + b],
                                         nll_win[:, lo:lo + b], use_replay)
        bar.update(1)
    bar.close()
    per_layer = {k: (np.stack([np.concatenate(v[l::L]) for l in range(L)]) if v else None) for k, v in rel.items()}
    with np.errstate(invalid="ignore", divide="ignore"):
        effect = eff_win.sum(-1) / n_win.sum()
        n_scored = scored_win.sum()
        base_ce = float(base_win.sum() / n_scored) if skip and n_scored else float("nan")
        delta = nll_win.sum(-1) / n_scored - base_ce if skip and n_scored else np.full(L, np.nan)
    later = np.arange(L)[None, :] > np.arange(L)[:, None]
    effect = np.where(later, effect, np.nan)
    if not skip:
        effect[:] = np.nan
    return DepthUseResult(
        layers=np.arange(L), rel_layer=per_layer["layer"], rel_attn=per_layer["attn"], rel_mlp=per_layer["mlp"],
        parts_absent=parts_absent, token_window=np.concatenate(tok_win), token_position=np.concatenate(tok_pos),
        skip_effect=effect, skip_effect_window=eff_win, window_n_tokens=n_win, skip_delta_ce=np.asarray(delta, float),
        skip_nll_window=nll_win, base_nll_window=base_win, window_n_scored=scored_win, base_ce=base_ce,
        replayed=bool(use_replay))


def _skip_batch(model, ids, att, real, sel, t, row_of, eff, nll, use_replay):
    """Every skip variant of one batch, summed into ``eff`` (skipped, layer, row) and ``nll`` (skipped, row);
    returns whether blocks were replayed (decided on the first batch when ``use_replay`` is None)."""
    L = model.n_layers
    b = ids.shape[0]
    rec = None
    if use_replay is not False:
        if use_replay is None:
            rec, problem = record_checked(model, ids, att, start=0)
            if problem:
                log.warning("%s: %s; depth use runs whole forward passes instead", model.model_id, problem)
                use_replay = False
            else:
                use_replay = True
        else:
            rec = record_block_inputs(model, ids, att, start=0)
    mask = real.double()
    if use_replay:
        clean = [rec.state(k) for k in range(L)] + [rec.last]
        for l in range(L):
            prev, final = clean[l], clean[l] if l == L - 1 else None
            for k, h in run_chain(model, rec, clean[l], range(l + 1, L)):
                change = _ratio((h - prev) - (clean[k + 1] - clean[k]), clean[k + 1] - clean[k])
                eff[l, k] += _sum_by_row(change, mask)
                prev = final = h
            nll[l] += np.bincount(row_of, weights=_nll(model, final, sel, t).cpu().numpy(), minlength=b)
        return True
    hooks = [HookSite(Site.RESID_PRE, 0)] + [HookSite(Site.RESID_POST, l) for l in range(L)]
    engine = make_backend("native", model, hooks)

    def stream(states):
        return [states[hooks[0].key]] + [states[HookSite(Site.RESID_POST, l).key] for l in range(L)]

    clean = stream(engine.run(ids, att)[0])
    for l in range(L):
        with delete_layer(model, l):
            states = stream(engine.run(ids, att)[0])
        for k in range(l + 1, L):
            change = _ratio((states[k + 1] - states[k]) - (clean[k + 1] - clean[k]), clean[k + 1] - clean[k])
            eff[l, k] += _sum_by_row(change, mask)
        nll[l] += np.bincount(row_of, weights=_nll(model, states[L], sel, t).cpu().numpy(), minlength=b)
    return False
