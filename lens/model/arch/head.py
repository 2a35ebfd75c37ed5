"""The head: the final norm and its kind, the modules up to the unembedding, and the logit scale and soft
cap, kept only when decoding the last block's output reproduces the model's logits on the probe."""

from __future__ import annotations

import torch
from torch import nn

from lens.model.arch import names as N
from lens.model.arch.identities import close, stream_scale
from lens.model.arch.probe import Trace
from lens.model.arch.site_map import Head
from lens.model.arch.tree import class_name, is_norm, modules_around
from lens.model.card import NormKind


def _norm_kind(norm: nn.Module, x: torch.Tensor | None, y: torch.Tensor | None) -> tuple[NormKind | None, float]:
    """RMS or layer norm, with a ``w`` or ``1 + w`` gain (Gemma), decided on the probe's tensors."""
    w = getattr(norm, "weight", None)
    b = getattr(norm, "bias", None)
    eps = next((float(getattr(norm, a)) for a in ("eps", "variance_epsilon", "epsilon")
                if isinstance(getattr(norm, a, None), (int, float))), 1e-6)
    if x is not None and y is not None and x.shape == y.shape:
        tol = 1e-3 if y.dtype in (torch.float32, torch.float64) else 2e-2  # a bfloat16 norm rounds its output
        xf = x.float()
        bases = {
            NormKind.RMS: xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps),
            NormKind.LAYER: (xf - xf.mean(-1, keepdim=True)) * torch.rsqrt(xf.var(-1, keepdim=True, unbiased=False) + eps),
        }
        for kind, base in bases.items():
            for offset in (0.0, 1.0):
                gain = (w.float() + offset) if isinstance(w, torch.Tensor) else 1.0 + offset * 0
                pred = base * gain + (b.float() if isinstance(b, torch.Tensor) else 0.0)
                if float((pred - y.float()).abs().max()) <= tol * (1 + float(y.float().abs().max())):
                    return kind, offset if isinstance(w, torch.Tensor) else 0.0
    cls = class_name(norm)
    if "RMS" in cls or "Rms" in cls:
        return NormKind.RMS, 0.0
    if isinstance(norm, nn.LayerNorm) or "LayerNorm" in cls:
        return NormKind.LAYER, 0.0
    return None, 0.0


def _logit_factors(cfg) -> tuple[list[float | None], list[float]]:
    caps: list[float | None] = [None]
    for a in N.SOFTCAP_ATTRS:
        v = getattr(cfg, a, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            caps.append(float(v))
    scales = [1.0]
    for a in N.LOGIT_SCALE_ATTRS:
        v = getattr(cfg, a, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v not in (0, 1):
            scales += [float(v), 1.0 / float(v)]
    return caps, scales


def apply_logit_factors(logits: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    if scale != 1.0:
        logits = logits * scale
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def derive_head(model: nn.Module, trace: Trace, base: str, last_block: str, cfg, scale: float = 1.0) -> Head:
    emb_out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    paths = {id(m): n for n, m in model.named_modules()}
    unembed = paths.get(id(emb_out)) if emb_out is not None else None
    last = trace.get(last_block)
    after = []
    for path in modules_around(model, last_block):
        rec = trace.get(path)
        if rec is not None and last is not None and rec.start > last.end and path != unembed:
            after.append((rec.start, path, model.get_submodule(path)))
    after.sort(key=lambda t: t[0])
    norm_path, norm_kind, offset, chain = None, None, 0.0, []
    cur = (last.out * scale if scale != 1.0 else last.out) if last is not None else None
    for _, path, mod in after:
        rec = trace.get(path)
        if not close(rec.inp, cur):
            continue
        if norm_path is None and not chain and is_norm(mod):
            norm_path = path
            norm_kind, offset = _norm_kind(mod, rec.inp, rec.out)
        elif not is_norm(mod):
            chain.append(path)
        cur = rec.out
    if unembed is None:
        return Head(norm=norm_path, norm_kind=norm_kind, norm_offset=offset,
                    why_not="the model has no output embedding (an encoder or a base model without its LM head)")
    if trace.logits is None:
        why = f"the probe forward failed ({trace.error})" if trace.error else "the model returned no logits"
        return Head(norm=norm_path, chain=tuple(chain), unembed=unembed, norm_kind=norm_kind, norm_offset=offset,
                    why_not=why)
    head_rec = trace.get(unembed)
    raw = head_rec.out if head_rec is not None else None
    pre = _pre_unembed_factor(model.get_submodule(unembed), cur, head_rec)
    if raw is None or pre is None:
        return Head(norm=norm_path, chain=tuple(chain), unembed=unembed, norm_kind=norm_kind, norm_offset=offset,
                    why_not="the unembedding does not receive the final norm's output: other modules stand between")
    # no final norm (a post-norm decoder such as GPT-1: every block ends in its own norm): the model's own
    # head is the unembedding alone, verified below like any other
    exact = trace.logits.dtype in (torch.float32, torch.float64)  # else a bfloat16 / float16 model's logits
    logits = trace.logits.float()
    caps, scales = _logit_factors(cfg)
    if pre != 1.0:  # the lens unembeds the final norm's output: what the unembedding gives for it is raw / pre
        raw, scales = raw.float() / pre, [*scales, pre]
    best = None
    for cap in caps:
        for s in scales:
            pred = apply_logit_factors(raw.float(), s, cap)
            if pred.shape != logits.shape:
                continue
            diff = float((pred - logits).abs().max())
            if best is None or diff < best[0]:
                best = (diff, s, cap)
    if best is None:
        return Head(norm=norm_path, chain=tuple(chain), unembed=unembed, norm_kind=norm_kind, norm_offset=offset,
                    why_not=f"the unembedding's output shape {tuple(raw.shape)} is not the logits' {tuple(logits.shape)}")
    diff, s, cap = best
    ok = diff <= 1e-4 * (1.0 + float(logits.abs().max())) if exact else diff <= 0.05 * (
        1.0 + float(logits.abs().max()))
    return Head(norm=norm_path, chain=tuple(chain), unembed=unembed, norm_kind=norm_kind, norm_offset=offset,
                softcap=cap, scale=s, verified=ok, max_diff=diff,
                why_not="" if ok else f"decoding the last block's output does not reproduce the logits (max |diff| {diff:.3g})")


def _pre_unembed_factor(unembed: nn.Module, cur, head_rec) -> float | None:
    """1.0 when the unembedding receives ``cur`` (the final norm's output); the factor when it receives a
    multiple of it and is linear without a bias (MiniCPM divides by ``logits_scaling`` first: the same as
    dividing the logits); None otherwise."""
    if head_rec is None:
        return None
    if close(head_rec.inp, cur):
        return 1.0
    if getattr(unembed, "bias", None) is not None or not isinstance(unembed, nn.Linear):
        return None
    return stream_scale(cur, head_rec.inp)


def last_block_scale(model: nn.Module, trace: Trace, last_block: str) -> float:
    """The factor between the last block's output and the first module after the blocks that receives a
    multiple of it (RWKV halves it before ``ln_out`` when the layer count is a multiple of ``rescale_every``)."""
    last = trace.get(last_block)
    if last is None or last.out is None:
        return 1.0
    after = sorted((trace.get(p).start, p) for p in modules_around(model, last_block)
                   if trace.get(p) is not None and trace.get(p).start > last.end)
    for _, p in after:
        s = stream_scale(last.out, trace.get(p).inp)
        if s is not None:
            return s
    return 1.0
