"""Derive any transformers model's site map from its module tree and one probe forward pass.

1. The blocks are the ``ModuleList`` with ``num_hidden_layers`` entries (the text model's, in a
   multimodal model). ``embed`` / ``resid_pre`` / ``resid_post`` are a block's input and output.
2. Inside block 0, the probe's tensors decide the composition (:class:`lens.model.card.BlockKind`):
   * find ``a`` (an attention output, or the norm applied to it: sandwich norms) and ``m`` (an MLP
     or expert-mixture output, or its norm) with ``resid_post = resid_pre + a + m``;
   * ``resid_mid`` is the input of the first module that receives ``resid_pre + a`` — none in a
     parallel block, where the site is then absent;
   * post-norm encoders: ``resid_mid = norm1(resid_pre + attn_proj)``, ``resid_post = norm2(resid_mid + mlp_proj)``;
   * no such decomposition (state-space, recurrent, hybrid blocks): only the four residual sites.
3. Every tap found in block 0 must satisfy the same identity at every layer, or its site is absent.
4. The head: the final norm is the first module after the last block that receives its output; the
   modules after it up to the unembedding, a logit scale and soft cap, are kept only if decoding
   the last block's output reproduces the model's own logits on the probe.

Where the model cannot be run (weights on the meta device), only the residual sites and the final
norm are mapped from names, and the map says it is unverified.

This module runs the steps; the parts live beside it: :mod:`~lens.model.arch.config` (what the config
says), :mod:`~lens.model.arch.tree` (step 1: the blocks, module roles), :mod:`~lens.model.arch.blocks`
(steps 2 and 3), :mod:`~lens.model.arch.head` (step 4), :mod:`~lens.model.arch.embedding` (position
scheme, embedding scale) and :mod:`~lens.model.arch.identities` (the tensor identities all of them check).
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch import nn

from lens.errors import LensInputError
from lens.model.arch import names as N
from lens.model.arch.blocks import BlockView, map_block_sites, order_in_block
from lens.model.arch.config import (config_int, d_model_of, is_causal_model, n_layers_of, text_config,
                                    vocab_of)
from lens.model.arch.embedding import embed_scale, position_scheme
from lens.model.arch.head import apply_logit_factors, derive_head, last_block_scale
from lens.model.arch.identities import close, stream_scale
from lens.model.arch.probe import PaddingCheck, Trace, check_padding, run_probe, sequence_change
from lens.model.arch.site_map import Head, SiteMap
from lens.model.arch.taps import INPUT, OUTPUT, Tap
from lens.model.arch.tree import descendants, find_block_list, has_list_of, is_norm, modules_around, parent_path
from lens.model.card import BlockKind
from lens.sites import Site

log = logging.getLogger(__name__)

# the entry point, and the names other modules imported from here before the derivation's parts moved to
# the modules named above (config, tree, identities, blocks, head, embedding)
__all__ = ["derive_site_map", "apply_logit_factors", "close", "d_model_of", "vocab_of", "n_layers_of", "text_config",
           "config_int", "is_causal_model", "find_block_list"]


FINITE_CHUNK = 1 << 22  # elements checked at a time: a 128k x 4096 embedding's mask whole would be 0.5 GB


def _all_finite(p: torch.Tensor) -> bool:
    """Whether every element of ``p`` is finite, checked in chunks (no tensor-sized mask)."""
    flat = p.detach().reshape(-1)  # a view for the contiguous tensors parameters are
    return all(bool(torch.isfinite(flat[i:i + FINITE_CHUNK]).all()) for i in range(0, flat.numel(), FINITE_CHUNK))


@contextlib.contextmanager
def _finite_weights(model: nn.Module):
    """Set the model's NaN / inf weights to 0 for the probe forward (the site map is a fact about the
    module tree, and non-finite states would hide every identity it checks); restore them after.
    Yields how many there were."""
    saved = []
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and not p.is_meta and not _all_finite(p):
                bad = ~torch.isfinite(p)  # a broken model only: the mask of a whole tensor
                saved.append((p, bad, p[bad].clone()))
                p[bad] = 0
    try:
        yield sum(int(b.sum()) for _, b, _ in saved)
    finally:
        with torch.no_grad():
            for p, bad, values in saved:
                p[bad] = values


def derive_site_map(model: nn.Module, *, probe: bool = True) -> SiteMap:
    """The site map of a transformers model (see the module docstring)."""
    cfg = text_config(model)
    model_type = str(getattr(model.config, "model_type", "") or type(model).__name__)
    L = n_layers_of(model)
    d = d_model_of(model)
    dec = getattr(cfg, "decoder_layers", None)
    if isinstance(dec, int) and dec != L and not has_list_of(model, L):  # decoder-only wrapper of an encoder-decoder
        L = dec
    layers = find_block_list(model, L)
    base = parent_path(layers)
    blocks = model.get_submodule(layers)
    # weights offloaded by accelerate (hf_device_map) are on the meta device between forwards, yet the model runs
    meta = any(p.is_meta for p in model.parameters()) and not getattr(model, "hf_device_map", None)
    n_experts = config_int(cfg, N.N_EXPERT_ATTRS) or 0
    common = {
        Site.EMBED: Tap(f"{layers}.0", INPUT),
        Site.RESID_PRE: Tap(f"{layers}.{{l}}", INPUT),
        Site.RESID_POST: Tap(f"{layers}.{{l}}", OUTPUT),
    }
    kw = dict(model_type=model_type, architecture=type(model).__name__, layers=layers, n_layers=L,
              position=position_scheme(model, cfg), is_causal=is_causal_model(model))
    if meta or not probe:
        return _unverified(model, common, kw, base, "the weights are not loaded (meta device)" if meta else
                           "derived without a probe forward")

    with _finite_weights(model) as n_bad:
        trace = run_probe(model, _watch_list(model, layers, blocks, L), vocab_of(model))
        padding = _padding(model, layers, L) if not trace.error else PaddingCheck(None)
    _refuse_pooling(trace, layers, d, model)
    if trace.error or trace.get(f"{layers}.0") is None:
        why = f"the probe forward failed ({trace.error})" if trace.error else "block 0 never ran"
        return _unverified(model, common, kw, base, why)

    views = [BlockView(trace, f"{layers}.{l}", blocks[l], d) for l in range(L)]
    between = [stream_scale(views[l].Y, views[l + 1].X) for l in range(L - 1)]
    broken = next((l for l in range(L - 1) if between[l] is None), None)
    if broken is not None or views[0].X is None or views[0].X.shape[-1] != d:
        raise LensInputError(
            f"{model_type} ({type(model).__name__}): the modules in {layers} do not form a residual stream "
            + (f"(block {broken + 1} does not receive block {broken}'s output)" if broken is not None else
               f"(block 0 does not receive a (batch, seq, {d}) state)")
            + ", so resid_pre / resid_post cannot be mapped; this family is not supported")
    if views[0].X.dim() > 3:  # hyper-connections (DeepSeek V4): several residual streams per token
        raise LensInputError(
            f"{model_type} ({type(model).__name__}): its blocks pass a {tuple(views[0].X.shape)} state, several "
            f"residual streams of width {d} per token, not one (batch, seq, {d}) residual stream, so resid_pre / "
            "resid_post cannot be mapped to one state per token; this family is not supported")
    notes: list[str] = list(_padding_notes(padding))
    if n_bad:
        notes.append(f"{n_bad} weights are NaN or inf: the probe forward that maps the sites ran with them set "
                     "to 0 (restored after); captures record the non-finite states they cause")
    taps = dict(common)
    absent: dict = {}
    site_layers: dict = {}
    scales: dict = {}
    kind, decomposed = map_block_sites(model, trace, layers, blocks, views, n_experts, taps, absent, site_layers,
                                        scales, notes)
    order = order_in_block(views, taps, site_layers)
    last_scale = last_block_scale(model, trace, f"{layers}.{L - 1}")
    if any(b != 1.0 for b in between) or last_scale != 1.0:
        scales[Site.RESID_POST] = tuple(between) + (last_scale,)
        notes.append("the residual stream is rescaled between blocks: resid_post is a block's output times "
                     "its layer's scale, the state the next block (or the final norm) receives")
    if Site.ATTN_OUT in scales:
        notes.append("attn_out / mlp_out are the sub-blocks' outputs times their scale, as added to the stream")
    head = derive_head(model, trace, base, f"{layers}.{L - 1}", cfg, last_scale)
    if head.norm is not None:
        taps[Site.FINAL_NORM] = Tap(head.norm, OUTPUT)
    else:
        absent[Site.FINAL_NORM] = ("post-norm blocks: every block ends in its own norm, there is no final norm"
                                   if kind is BlockKind.POST_NORM else "no norm runs on the last block's output")
    return SiteMap(block=kind, taps=taps, absent=absent, head=head, site_layers=site_layers, verified=True, order=order,
                   notes=tuple(notes), embed_scale=embed_scale(model, trace, f"{layers}.0"),
                   padding_invariant=padding.invariant, padding_max_rel=padding.max_rel, scales=scales,
                   n_experts=n_experts if Site.ROUTER_LOGITS in taps else (n_experts if decomposed else 0), **kw)


def _watch_list(model: nn.Module, layers: str, blocks, L: int) -> list[str]:
    """The modules the probe forward records: every block and everything inside it, what runs after the
    last block, and the input and output embeddings."""
    watch = [layers + f".{l}" for l in range(L)]
    for l in range(L):
        watch += [f"{layers}.{l}.{r}" for r in descendants(blocks[l])]
    watch += modules_around(model, f"{layers}.{L - 1}")
    paths = {id(m): n for n, m in model.named_modules()}
    for m in (model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None,
              model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None):
        if m is not None and id(m) in paths:
            watch.append(paths[id(m)])
    return list(dict.fromkeys(watch))


def _padding(model: nn.Module, layers: str, L: int) -> PaddingCheck:
    """The probe's padding check (:func:`lens.model.arch.probe.check_padding`) on every block's output."""
    pad = getattr(text_config(model), "pad_token_id", None)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    tol = 1e-4 if dtype in (torch.float32, torch.float64) else 2e-2
    return check_padding(model, [f"{layers}.{l}" for l in range(L)], vocab_of(model),
                         pad if isinstance(pad, int) and 0 <= pad < vocab_of(model) else 0, tol)


def _padding_notes(padding: PaddingCheck) -> list[str]:
    if padding.invariant is False:
        return [f"not padding-invariant: a padded row's states differ from its unpadded forward (relative "
                f"{padding.max_rel:.2g} at {padding.where}); windows are captured without padding (a batch runs "
                "its windows of equal length together)"]
    if padding.invariant is None and padding.error:
        return [f"padding invariance not checked ({padding.error}): windows are batched with padding"]
    return []


def _refuse_pooling(trace: Trace, layers: str, d: int, model: nn.Module) -> None:
    """A family whose blocks pool (or otherwise change) the sequence has no state per input token at
    every layer: refused by name, on what the probe saw, before any site is mapped."""
    where = sequence_change(trace, layers, d)
    if where:
        mt = str(getattr(model.config, "model_type", "") or type(model).__name__)
        raise LensInputError(
            f"{mt} ({type(model).__name__}) pools or reorders the sequence between its blocks ({where}): its "
            "layers do not hold one state per input token, so no site can be stored per token; this family is "
            "not supported")


def _unverified(model, common: dict, kw: dict, base: str, why: str) -> SiteMap:
    """Residual sites only (they are block inputs and outputs by definition), and a final norm by name."""
    taps = dict(common)
    absent = {s: f"not verified: {why}" for s in (Site.RESID_MID, Site.ATTN_OUT, Site.MLP_OUT, Site.ROUTER_LOGITS)}
    base_mod = model.get_submodule(base) if base else model
    norms = [n for n, m in base_mod.named_children() if is_norm(m)]
    head = Head(why_not=f"not verified: {why}")
    if len(norms) == 1:
        path = f"{base}.{norms[0]}" if base else norms[0]
        taps[Site.FINAL_NORM] = Tap(path, OUTPUT)
        head = Head(norm=path, why_not=f"not verified: {why}")
    else:
        absent[Site.FINAL_NORM] = f"not verified: {why}"
    return SiteMap(block=BlockKind.UNVERIFIED, taps=taps, absent=absent, head=head, verified=False,
                   notes=(f"unverified map: {why}",), **kw)
