"""The fidelity check of a capture: a probe batch through the capture's backend and through the plain
Hugging Face forward, compared site by site (the record: :mod:`lens.store.fidelity`).

Before a capture writes anything, :func:`measure` runs its first ``PROBE_WINDOWS`` windows (of its part,
with ``--part``) through the capture's own engine — the states the store will hold — and through the
model's plain forward with ``output_hidden_states=True``, then compares:

* ``embed``, ``resid_pre``, ``resid_post`` with Hugging Face's hidden states. Two conventions exist,
  the ones ``tests/lens/families.py`` checks on every family: most families return
  ``hidden_states[0]`` = block 0's input (the embedding) and ``hidden_states[l + 1]`` = block ``l``'s
  output, the last entry after the final norm; Mamba, RWKV and their kin return block ``l``'s output at
  ``hidden_states[l]`` (no embedding entry; ``embed`` is then checked against the embedding lookup times
  the family's embedding scale). Which one holds is read from the forward itself: ``hidden_states[0]``
  is or is not what block 0 receives (a plain hook on the block list's first block). The last block's
  output, which the first convention returns only after the final norm, is read by a plain hook on the
  last block (times the card's scale of a rescaled stream), as the families test reads it.
* ``final_norm`` with the last hidden state where Hugging Face returns it normed.
* ``resid_mid``, ``attn_out``, ``mlp_out``, which no hidden state exposes, through the block identities
  (``resid_mid = resid_pre + attn_out``, ``resid_post = resid_mid + mlp_out``; a parallel block's
  ``resid_post = resid_pre + attn_out + mlp_out``) with ``resid_pre`` / ``resid_post`` taken from Hugging
  Face and the partner site from the capture (scaled sub-blocks are stored times their scale, so the
  identities hold as stored); a kind whose partner is not in the capture, post-norm blocks (a norm after
  each addition) and ``router_logits`` are "not checkable" — never compared with a neighbouring tensor.
* the logit lens of the last layer's ``resid_post`` with the model's logits (and top-1 agreement), where
  the model has a usable LM head.

Past the tolerance (:func:`tolerance_for`) the verdict is ``silently-wrong`` and :func:`require_faithful`
raises :class:`lens.errors.SilentlyWrong` (exit 2) before the store's first byte. A family that is not
padding-invariant runs without padding in both forwards (:mod:`lens.capturing.unpadded`).
"""

from __future__ import annotations

import dataclasses

import torch

from lens.capturing.batches import right_padded
from lens.capturing.unpadded import unpadded_if_needed
from lens.errors import SilentlyWrong
from lens.model.arch.taps import first_tensor, input_tensor
from lens.model.card import BlockKind
from lens.model.loading import attn_implementation, model_dtype_name
from lens.sites import Site
from lens.store.fidelity import (FLOAT32_TOLERANCE, HALF_ULPS, NOT_CHECKED, OK, SILENTLY_WRONG, TOLERANCES,
                                 FidelityRecord, LensCheck, SiteCheck, significant)

# forwards the check adds to a capture (of a padding-invariant model): the probe batch through the capture's
# engine, and through the plain forward
FORWARDS = 2
LENS_ROWS = 256  # tokens decoded at a time by the lens check
PROBE_WINDOWS = 2  # windows of the probe batch (at most the capture's batch size): one small extra forward each way
# the tolerances (FLOAT32_TOLERANCE, HALF_ULPS units of a 16-bit dtype's rounding) are documented with the record
# (lens.store.fidelity.TOLERANCES), which every reader judges a store by

_INF = float("inf")
SAME = 1e-6  # "is the same tensor" when reading the family's convention off its forward (they are equal, or far apart)
STANDARD = "hidden_states[0] = embed (block 0's input), hidden_states[l+1] = resid_post[l] (l < L-1)"
OUTPUTS = "hidden_states[l] = resid_post[l] (no embedding entry: the family returns block outputs)"


def tolerance_for(dtype: torch.dtype) -> float:
    """The stated tolerance of the fidelity check for a model running in ``dtype`` (relative, per token): the
    documented one (lens.store.fidelity.TOLERANCES) that readers judge the record by."""
    name = str(dtype).replace("torch.", "")
    if name in TOLERANCES:
        return TOLERANCES[name]
    if dtype in (torch.float32, torch.float64):
        return FLOAT32_TOLERANCE
    return float(HALF_ULPS * torch.finfo(dtype).eps)  # bfloat16: 0.03125, float16: 0.00391


class _PlainForward:
    """The model's own forward as an engine (``run(ids, mask) -> (states, logits)``), so that the padding
    fallback (:class:`lens.capturing.unpadded.EqualLengths`) runs it exactly as it runs the capture's: the
    hidden states as ``hidden.i``, block 0's input and the last block's output by plain hooks."""

    name = "hugging-face"

    def __init__(self, model):
        self.model = model

    @torch.inference_mode()
    def run(self, input_ids, attention_mask, **_):
        hf = self.model.hf_model
        blocks = self.model.layers
        seen: dict = {}

        def pre(mod, args, kwargs):
            seen.setdefault("block0_input", input_tensor(args, kwargs))

        def post(mod, args, output):
            seen.setdefault("last_block", first_tensor(output))

        handles = [blocks[0].register_forward_pre_hook(pre, with_kwargs=True),
                   blocks[len(blocks) - 1].register_forward_hook(post)]
        out, error = None, None
        try:
            for kw in ({"use_cache": False, "output_hidden_states": True}, {"output_hidden_states": True}):
                try:
                    out = hf(input_ids=input_ids, attention_mask=attention_mask, **kw)
                    break
                except TypeError as exc:
                    seen.clear()
                    error = exc
        finally:
            for h in handles:
                h.remove()
        if out is None:
            raise error
        states = {k: v.detach().clone() for k, v in seen.items() if isinstance(v, torch.Tensor) and v.dim() == 3}
        hs = getattr(out, "hidden_states", None)
        for i, h in enumerate(hs or ()):
            if isinstance(h, torch.Tensor) and h.dim() == 3:
                states[f"hidden.{i}"] = h
        logits = getattr(out, "logits", None)
        return states, (logits if isinstance(logits, torch.Tensor) and logits.dim() == 3 else None)


def _rows(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return x[keep.to(x.device)]


def relative(got: torch.Tensor | None, ref: torch.Tensor | None, *terms: torch.Tensor) -> float | None:
    """The largest per-token ``||got - ref|| / max(||ref||, ||term||...)`` (None: not finite where ``ref`` is,
    or another shape). Entries non-finite in both at the same places are left out of both."""
    if got is None or ref is None or tuple(got.shape) != tuple(ref.shape):
        return None
    g, r = got.float(), ref.to(got.device).float()
    fg, fr = torch.isfinite(g), torch.isfinite(r)
    if not torch.equal(fg, fr):
        return None
    g, r = torch.where(fg, g, 0.0), torch.where(fr, r, 0.0)
    scale = r.norm(dim=-1)
    for t in terms:
        if tuple(t.shape) != tuple(got.shape):
            return None
        t = t.to(got.device).float()
        scale = torch.maximum(scale, torch.where(torch.isfinite(t), t, 0.0).norm(dim=-1))
    diff = (g - r).norm(dim=-1)
    rel = torch.where(diff == 0, torch.zeros_like(diff), diff / scale.clamp_min(torch.finfo(torch.float32).tiny))
    return float(rel.max()) if rel.numel() else 0.0


class _Reference:
    """Hugging Face's states for the probe's real tokens: ``pre(l)`` / ``post(l)`` (resid_pre / resid_post of
    layer ``l``), ``embed()``, ``final()`` (the last hidden state where it is normed), with what each is."""

    def __init__(self, model, states: dict, keep: torch.Tensor, ids: torch.Tensor):
        self.model, self.L = model, model.n_layers
        hidden = sorted((int(k.split(".")[1]), v) for k, v in states.items() if k.startswith("hidden."))
        self.hs = [_rows(v, keep) for _, v in hidden]
        self.x0 = _rows(states["block0_input"], keep) if "block0_input" in states else None
        scales = model.site_map.scales.get(Site.RESID_POST)
        last = states.get("last_block")
        self.last = None if last is None else _rows(last, keep) * (float(scales[-1]) if scales else 1.0)
        self.ids = ids[keep.to(ids.device)]
        n = len(self.hs)
        first = None if self.x0 is None or not n else relative(self.hs[0], self.x0)
        if n == self.L + 1 and first is not None and first <= SAME:
            self.convention = STANDARD
        elif n in (self.L, self.L + 1) and self.x0 is not None and (first is None or first > SAME):
            self.convention = OUTPUTS
        else:
            self.convention = ""
        self.why = "" if self.convention else (
            f"Hugging Face returned {n} hidden states for {self.L} layers" if n else
            "Hugging Face returns no hidden states for this model")

    def embed(self):
        if self.convention == STANDARD:
            return self.hs[0], "hidden_states[0]"
        if self.convention == OUTPUTS:
            emb = self.model.hf_model.get_input_embeddings()
            x = emb(self.ids.to(emb.weight.device))
            scale = self.model.site_map.embed_scale
            return (x * scale if scale else x), "the embedding lookup x the family's embedding scale"
        return None, self.why

    def pre(self, l: int):
        if self.convention == STANDARD:
            return self.hs[l], f"hidden_states[{l}]"
        if self.convention == OUTPUTS:
            return self.embed() if l == 0 else (self.hs[l - 1], f"hidden_states[{l - 1}]")
        return None, self.why

    def post(self, l: int):
        if l == self.L - 1 and self.convention != OUTPUTS:
            if self.last is None:
                return None, "the last block's output was not seen"
            return self.last, "the last block's output (plain hook; hidden_states[L] is after the final norm)"
        if self.convention == STANDARD:
            return self.hs[l + 1], f"hidden_states[{l + 1}]"
        if self.convention == OUTPUTS:
            return self.hs[l], f"hidden_states[{l}]"
        return None, self.why

    def final(self):
        """The last hidden state where Hugging Face returns it after the final norm (it then differs from the
        last block's output)."""
        if not self.hs or self.last is None or len(self.hs) != self.L + 1:
            return None, "Hugging Face returns no hidden state after the final norm"
        same = relative(self.hs[-1], self.last)
        if same is not None and same <= SAME:
            return None, "Hugging Face's last hidden state is the last block's output, not the final norm's"
        return self.hs[-1], f"hidden_states[{self.L}]"


def _identity(site: str, l: int, card, got: dict, ref: _Reference):
    """(reference, terms, what) for a site no hidden state exposes, from its block identity; or
    (None, (), why not)."""
    mine = lambda s: got.get(f"{s}.{l}")  # noqa: E731 - the capture's own state of a partner site
    if card.block is BlockKind.POST_NORM:
        return None, (), "post-norm blocks normalise after each addition: no additive identity checks it"
    P, p_what = ref.pre(l)
    Q, q_what = ref.post(l)
    if P is None or Q is None:
        return None, (), p_what if P is None else q_what
    attn, mlp, mid = mine("attn_out"), mine("mlp_out"), mine("resid_mid")
    parallel = card.block is BlockKind.PARALLEL
    if site == "resid_mid":
        if attn is not None:
            return P + attn, (P, attn), "resid_pre + attn_out"
        if mlp is not None:
            return Q - mlp, (Q, mlp), "resid_post - mlp_out"
        return None, (), "needs attn_out or mlp_out of the same layer in the capture"
    if site == "attn_out":
        if mid is not None and not parallel:
            return mid - P, (mid, P), "resid_mid - resid_pre"
        if mlp is not None:
            return Q - P - mlp, (Q, P, mlp), "resid_post - resid_pre - mlp_out"
        return None, (), "needs resid_mid or mlp_out of the same layer in the capture"
    if site == "mlp_out":
        if mid is not None and not parallel:
            return Q - mid, (Q, mid), "resid_post - resid_mid"
        if attn is not None:
            return Q - P - attn, (Q, P, attn), "resid_post - resid_pre - attn_out"
        return None, (), "needs resid_mid or attn_out of the same layer in the capture"
    return None, (), "Hugging Face's hidden states do not hold it"


def _reference(site: str, l: int | None, card, got: dict, ref: _Reference):
    """(reference, terms, what it is) for one hook of the capture."""
    if site == Site.EMBED.value:
        r, what = ref.embed()
        return r, (), what
    if site == Site.RESID_PRE.value:
        r, what = ref.pre(l)
        return r, (), what
    if site == Site.RESID_POST.value:
        r, what = ref.post(l)
        return r, (), what
    if site == Site.FINAL_NORM.value:
        r, what = ref.final()
        return r, (), what
    if site in (Site.RESID_MID.value, Site.ATTN_OUT.value, Site.MLP_OUT.value):
        return _identity(site, l, card, got, ref)
    return None, (), "Hugging Face returns no router logits among its hidden states"


def _against(site: str, convention: str) -> str:
    """What a site kind is compared with, in words (per kind, for the record)."""
    return {
        "embed": "hidden_states[0]" if convention == STANDARD else "the embedding lookup x embedding scale",
        "resid_pre": "hidden_states[l]" if convention == STANDARD else "hidden_states[l-1] (layer 0: the embedding)",
        "resid_post": ("hidden_states[l+1] (the last layer: the last block's output, by a plain hook)"
                       if convention == STANDARD else "hidden_states[l]"),
        "final_norm": "the last hidden state (after the final norm)",
    }.get(site, "")


def _lens(model, got: dict, logits, keep, tol: float) -> LensCheck:
    if not model.site_map.head.usable:
        return LensCheck(why_not=model.card().head_note or "no language-model head")
    key = f"{Site.RESID_POST.value}.{model.n_layers - 1}"
    if key not in got:
        return LensCheck(why_not=f"resid_post of the last layer ({model.n_layers - 1}) is not in this capture")
    if logits is None:
        return LensCheck(why_not="the model's forward returned no logits")
    want = _rows(logits, keep)
    head = model.unembed_module.weight
    # an offloaded head's weights sit on the meta device until its module runs: its accelerate hook moves
    # the input on, so the states stay where they are
    states = got[key] if head.is_meta else got[key].to(head.device)
    if want.shape[:-1] != states.shape[:-1]:
        return LensCheck(failed=True)
    rels, agree, max_abs = [], 0, 0.0
    for lo in range(0, states.shape[0], LENS_ROWS):  # (rows, vocab) float32 a chunk at a time: large vocabularies
        with torch.inference_mode():
            lensed = model.decode(states[lo:lo + LENS_ROWS]).float()
        w = want[lo:lo + LENS_ROWS].to(lensed.device).float()
        rels.append(relative(lensed, w))
        if rels[-1] is None:
            return LensCheck(failed=True)
        agree += int((lensed.argmax(-1) == w.argmax(-1)).sum())
        max_abs = max(max_abs, float((lensed - w).nan_to_num(0.0, 0.0, 0.0).abs().max()))
    rel = significant(max(rels, default=0.0))
    top1 = agree / max(states.shape[0], 1)
    return LensCheck(max_abs=significant(max_abs), max_rel=rel, top1_agreement=round(top1, 4), failed=rel > tol)


def _probe_batch(win, lo: int, hi: int, batch_size: int, pad_id: int, device):
    hi = min(hi, lo + min(PROBE_WINDOWS, batch_size))
    ids, mask = right_padded(win.input_ids[lo:hi], pad_id)
    return hi - lo, torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


def not_checked(model, backend: str, why: str) -> FidelityRecord:
    sm = model.site_map
    return FidelityRecord(verdict=NOT_CHECKED, tolerance=tolerance_for(model.dtype), model_dtype=model_dtype_name(model),
                          attn=attn_implementation(model), backend=backend, padding_invariant=sm.padding_invariant,
                          padding_max_rel=significant(sm.padding_max_rel), why_not=why)


@torch.inference_mode()
def measure(model, engine, win, start: int, stop: int, batch_size: int, pad_id: int, device, backend: str,
            remote=False) -> FidelityRecord:
    """The fidelity record of a capture by ``engine`` (its backend's name: ``backend``) of ``model`` over the
    windows ``[start, stop)`` of ``win``: its first windows re-run through the plain forward and compared."""
    sm = model.site_map
    if remote:
        return not_checked(model, backend, "the model ran remotely (NDIF): there is no local forward to compare with")
    if not sm.verified:
        return not_checked(model, backend, "the site map is unverified (the model could not be run when it was mapped)")
    n_windows, ids, mask = _probe_batch(win, start, stop, batch_size, pad_id, device)
    states, _ = engine.run(ids, mask)
    hf_states, logits = unpadded_if_needed(_PlainForward(model), model).run(ids, mask)
    keep = mask.bool()
    got = {k: _rows(v, keep) for k, v in states.items()}
    ref = _Reference(model, hf_states, keep, ids)
    card, tol = model.card(), tolerance_for(model.dtype)
    compared: dict = {}  # site -> [(relative difference or None: not finite / another shape, layer, failed)]
    why: dict = {}
    for key in got:
        site, _, layer = key.partition(".")
        l = int(layer) if layer else None
        r, terms, what = _reference(site, l, card, got, ref)
        if r is None:
            why.setdefault(site, what)
            continue
        rel = significant(relative(got[key], r, *terms))
        compared.setdefault(site, []).append((rel, l, rel is None or rel > tol, what, site))
    sites, failures = [], []
    present = {k.partition(".")[0] for k in got}
    for site in (s.value for s in Site if s.value in present):
        rows = compared.get(site)
        if not rows:
            sites.append(SiteCheck(site=site, why_not=why.get(site, "")))
            continue
        rel, l, _, what, _ = max(rows, key=lambda r: _INF if r[0] is None else r[0])
        failed = any(r[2] for r in rows)
        failures += [r for r in rows if r[2]]
        # hidden-state sites: the pattern over layers; identity sites: the identity used (the same at every layer)
        sites.append(SiteCheck(site=site, against=_against(site, ref.convention) or what, max_rel=rel, layer=l,
                               layers=len(rows), failed=failed))
    lens_check = _lens(model, got, logits, keep, tol)
    failure = ""
    if failures:
        rel, l, _, what, site = max(failures, key=lambda r: _INF if r[0] is None else r[0])
        at = "" if l is None else f" at layer {l}"
        by = "by a non-finite amount or in shape" if rel is None else f"by {rel:.3g}"
        failure = f"{site}{at} differs from Hugging Face's {what} {by} (relative, per token; tolerance {tol:g})"
    elif lens_check.failed:
        by = "by a non-finite amount or in shape" if lens_check.max_rel is None else f"by {lens_check.max_rel:.3g}"
        failure = (f"resid_post at layer {model.n_layers - 1} through the logit lens differs from the model's logits "
                   f"{by} (relative, per token; tolerance {tol:g})")
    bad = bool(failures) or lens_check.failed
    if not bad and not compared and not lens_check.checked:
        verdict = NOT_CHECKED
    else:
        verdict = SILENTLY_WRONG if bad else OK
    return FidelityRecord(
        verdict=verdict, tolerance=tol, model_dtype=model_dtype_name(model), attn=attn_implementation(model),
        backend=backend, windows=n_windows, tokens=int(keep.sum()), hidden_states=ref.convention or ref.why,
        sites=tuple(sites), lens=lens_check, padding_invariant=sm.padding_invariant,
        padding_max_rel=significant(sm.padding_max_rel), failure=failure,
        why_not="" if verdict != NOT_CHECKED else "no site of this capture could be compared with Hugging Face")


def require_faithful(record: FidelityRecord, model_id: str, allow: bool = False) -> FidelityRecord:
    """``record`` if its verdict is not silently wrong (or ``allow``: then marked accepted), else
    :class:`SilentlyWrong` with one line naming the site, layer, difference and tolerance."""
    if record.verdict != SILENTLY_WRONG:
        return record
    if allow:
        return dataclasses.replace(record, accepted=True)
    raise SilentlyWrong(
        f"silently wrong: {record.failure} for {model_id} ({record.model_dtype}, {record.backend} backend); "
        f"nothing was captured — the site map or the backend reads another tensor than the model computes (see "
        f"`lens inspect {model_id}`); --allow-silently-wrong keeps such a store, marked")
