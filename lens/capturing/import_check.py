"""The fidelity check of an import: the first windows of hidden states captured elsewhere (vLLM, a SAELens cache,
a safetensors export) against the plain Hugging Face forward of the model they claim to come from.

Each probe window's token ids are run through the model (``output_hidden_states=True``, no padding: one window at
a time) and every imported site and layer that a hidden state or a block identity exposes is compared with it, as
a capture's own check compares (:mod:`lens.capturing.fidelity`: relative per token). A site that Hugging Face's
hidden states do not expose and no identity reaches (``resid_mid`` or ``attn_out`` imported alone, a SAELens cache
of one hook) is compared with the workbench's own hook of that site on the same window (the native capture, whose
site map is checked against Hugging Face family by family), so an import of one sub-block site is verified too; a
site the family does not have is not checked, with the site map's reason. The tolerance is the larger
of the model's dtype's and that of the precision the imported states carry (bfloat16 states from a serving engine,
or float32 states that hold only bfloat16 values — a bfloat16 capture written to a float32 SAELens cache — are
judged at bfloat16's four machine epsilons); the record names that dtype as its ``model_dtype``. A source whose
layers are shifted by one differs by the update of a whole block and is
refused before anything is written (:class:`lens.errors.SilentlyWrong`, exit 2).
"""

from __future__ import annotations

import numpy as np
import torch

from lens.capturing.backends.native import NativeBackend
from lens.capturing.fidelity import (_INF, PROBE_WINDOWS, _PlainForward, _reference, _Reference, _rows, relative,
                                     tolerance_for)
from lens.errors import LensInputError, SilentlyWrong
from lens.model.loading import attn_implementation, model_dtype_name
from lens.sites import HookSite, Site
from lens.store.fidelity import (NOT_CHECKED, OK, SILENTLY_WRONG, FidelityRecord, LensCheck, SiteCheck, is_own_hook,
                                 own_hook, significant)
from lens.store.format import DTYPES, from_storage

__all__ = ["check_import", "not_verified", "require_match", "PROBE_WINDOWS"]


def _meta(model):
    return model_dtype_name(model), attn_implementation(model)


def not_verified(why: str, backend: str, dtype: str, model=None) -> FidelityRecord:
    """The record of an import that was not compared with a model (``why``): verdict not-checked, judged (were
    it ever) at the tolerance of the imported states' dtype ``dtype``."""
    attn = _meta(model)[1] if model is not None else ""
    return FidelityRecord(verdict=NOT_CHECKED, tolerance=tolerance_for(DTYPES[dtype][0]), model_dtype=dtype, attn=attn,
                          backend=backend, why_not=f"not verified: {why}")


def _precision(probes, dtype: str) -> str:
    """The precision the imported states carry: ``dtype``, or a 16-bit one when float32 states hold only values
    of it (a bfloat16 capture widened to float32 by a format without bfloat16, as a SAELens cache is)."""
    if dtype != "float32":
        return dtype
    values = [np.asarray(a) for _, states in probes for a in states.values()]
    if values and all(not (v.view(np.uint32) & 0xFFFF).any() for v in values):
        return "bfloat16"
    if values and all(np.array_equal(v.astype(np.float16).astype(np.float32), v) for v in values):
        return "float16"
    return dtype


def _judged_dtype(model, dtype: str) -> str:
    """The dtype an import's differences are judged at: the model's, or the imported states' where those are
    coarser (bfloat16 states of a serving engine compared with a float32 forward). The record names it as its
    ``model_dtype``: the precision the states were computed in, which readers judge the record by."""
    model_dtype = _meta(model)[0]
    return dtype if tolerance_for(DTYPES[dtype][0]) > tolerance_for(model.dtype) else model_dtype


def _native_hooks(model, keys) -> tuple[list, dict]:
    """(hooks, why not per site) of the workbench's own capture for the imported ``keys`` no hidden state
    exposes: a site the family lacks (or lacks at that layer) is left out with the site map's reason."""
    hooks, why = [], {}
    for key in keys:
        hook = HookSite.from_key(key)
        try:
            model.site_map.tap(hook)
        except LensInputError as exc:
            why.setdefault(hook.site.value, str(exc))
            continue
        hooks.append(hook)
    return hooks, why


@torch.inference_mode()
def check_import(model, probes, sites: dict, dtype: str, backend: str) -> FidelityRecord:
    """``probes``: ``[(token ids (n,), {site: (layers, n, width) storage array})]``, the first windows of the source;
    ``sites``: site -> layers as the store will record them."""
    card = model.card()
    judged = _judged_dtype(model, _precision(probes, dtype))
    tol = tolerance_for(getattr(torch, judged))
    rows: dict = {}
    why: dict = {}
    n_tokens = 0
    convention = ""
    for ids, states in probes:
        x = torch.as_tensor(np.asarray(ids, dtype=np.int64))[None].to(model.device)
        mask = torch.ones_like(x)
        hf_states, _ = _PlainForward(model).run(x, mask)
        keep = mask.bool()
        ref = _Reference(model, hf_states, keep, x)
        convention = ref.convention or ref.why
        got = {}
        for site, layers in sites.items():
            for idx, l in enumerate(layers):
                key = site if l is None else f"{site}.{l}"
                got[key] = from_storage(states[site][idx], dtype).float().to(model.device)
        unexposed = {}
        for key, value in got.items():
            site, _, layer = key.partition(".")
            l = int(layer) if layer else None
            r, terms, what = _reference(site, l, card, got, ref)
            if r is None:
                unexposed[key] = what
                continue
            rel = significant(relative(value, r, *terms))
            rows.setdefault(site, []).append((rel, l, rel is None or rel > tol, what))
        hooks, lacking = _native_hooks(model, unexposed)
        for key, what in unexposed.items():
            why.setdefault(key.partition(".")[0], lacking.get(key.partition(".")[0], what))
        if hooks:
            native, _ = NativeBackend(model, hooks).run(x, mask)
            for hook in hooks:
                rel = significant(relative(got[hook.key], _rows(native[hook.key], keep)))
                rows.setdefault(hook.site.value, []).append((rel, hook.layer, rel is None or rel > tol,
                                                             own_hook(hook.site.value)))
        n_tokens += len(ids)
    checks, failures = [], []
    for site in (s.value for s in Site if s.value in sites):
        found = rows.get(site)
        if not found:
            checks.append(SiteCheck(site=site, why_not=why.get(site, "")))
            continue
        rel, l, _, what = max(found, key=lambda r: _INF if r[0] is None else r[0])
        bad = [r for r in found if r[2]]
        failures += [(site, *r) for r in bad]
        checks.append(SiteCheck(site=site, against=what, max_rel=rel, layer=l, layers=len({r[1] for r in found}),
                              failed=bool(bad)))
    failure = ""
    if failures:
        site, rel, l, _, what = max(failures, key=lambda r: _INF if r[1] is None else r[1])
        at = "" if l is None else f" at layer {l}"
        by = "by a non-finite amount or in shape" if rel is None else f"by {rel:.3g}"
        theirs = what if is_own_hook(what) else f"Hugging Face's {what}"
        failure = f"{site}{at} differs from {theirs} {by} (relative, per token; tolerance {tol:g})"
    verdict = SILENTLY_WRONG if failures else OK if rows else NOT_CHECKED
    return FidelityRecord(
        verdict=verdict, tolerance=tol, model_dtype=judged, attn=_meta(model)[1], backend=backend, windows=len(probes),
        tokens=n_tokens, hidden_states=convention, sites=tuple(checks),
        lens=LensCheck(why_not="an import is checked on its states, not through the logit lens"),
        padding_invariant=model.site_map.padding_invariant, padding_max_rel=significant(model.site_map.padding_max_rel),
        failure=failure, why_not="" if rows else "no imported site could be compared with the model: "
                                              + "; ".join(f"{k}: {v}" for k, v in why.items()))


def require_match(record: FidelityRecord, model_id: str, source: str, layer_ids: bool = False) -> FidelityRecord:
    """``record`` unless it says the states differ from the model; ``layer_ids``: the source's layers were given by
    the user (vLLM's --layers), the first thing to check."""
    if record.verdict == SILENTLY_WRONG:
        hint = ("check which layer ids the files hold (--layers) and that they come from this model" if layer_ids
                else "check that the source comes from this model (--model) and holds the sites it names")
        raise SilentlyWrong(f"the states in {source} do not match {model_id}: {record.failure}; nothing was written — "
                            f"{hint}")
    return record
