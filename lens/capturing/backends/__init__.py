"""Capture backends: each runs a batch and returns the states at the requested hook sites.

* ``native`` — plain PyTorch forward hooks on the Hugging Face modules (default, fastest; stops the
  forward pass once the deepest requested site has fired).
* ``transformer-lens`` — TransformerLens 4 ``TransformerBridge`` with ``run_with_cache``.
* ``nnsight`` — an nnsight ``LanguageModel`` trace; ``remote=True`` sends it to NDIF.

All return ``{hook.key: tensor (batch, seq, width)}`` for one padded batch.

The bridge and nnsight read each site their own way (the bridge's hook points, nnsight's envoys).
Before either captures anything, every requested site is read once through it and once through
the native hooks of the model's site map on a probe batch; a site where they differ is refused,
so no backend returns a neighbouring tensor under a site's name.
"""

from __future__ import annotations

import torch

from lens.errors import LensInputError
from lens.capturing.unpadded import unpadded_if_needed
from lens.model.arch.identities import close
from lens.model.arch.probe import probe_ids
from lens.capturing.backends.native import NativeBackend
from lens.capturing.backends.protocol import CaptureBackend
from lens.capturing.backends.tl import TransformerLensBackend

BACKENDS = ("native", "transformer-lens", "nnsight")


def make_backend(name: str, model, hooks, **kwargs) -> CaptureBackend:
    """The engine ``name`` for ``model``; a family that is not padding-invariant runs without padding
    (:mod:`lens.capturing.unpadded`)."""
    return unpadded_if_needed(_make_backend(name, model, hooks, **kwargs), model)


def _make_backend(name: str, model, hooks, **kwargs):
    key = str(name).lower().replace("_", "-")
    if key == "native":
        return NativeBackend(model, hooks)
    if key in ("transformer-lens", "transformerlens", "tl"):
        return check_against_native(TransformerLensBackend(model, hooks), model, hooks)
    if key == "nnsight":
        from lens.capturing.backends.nnsight_backend import NNsightBackend  # lazy: import cost (nnsight ~1 s)

        engine = NNsightBackend(model, hooks, **kwargs)
        return engine if kwargs.get("remote") else check_against_native(engine, model, hooks)
    raise LensInputError(f"unknown backend {name!r}: expected one of {', '.join(BACKENDS)}")


def check_against_native(engine: CaptureBackend, model, hooks) -> CaptureBackend:
    """``engine`` if it reads every hook as the native site map does on a probe batch, else a clear error."""
    ids = probe_ids(model.d_vocab, model.device)
    mask = torch.ones_like(ids)
    try:
        got, _ = engine.run(ids, mask)
    except Exception as exc:  # the wrapped library raises many types for families it cannot run
        raise LensInputError(
            f"the {engine.name} backend cannot run {model.model_id} ({model.family}): {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:160] if str(exc) else ''}; use --backend native") from None
    want, _ = NativeBackend(model, hooks).run(ids, mask)
    bad = [h.key for h in hooks if not close(_float(got.get(h.key)), _float(want[h.key]))]
    if bad:
        raise LensInputError(
            f"the {engine.name} backend reads another tensor than the {model.family} site map at "
            f"{', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''} (its hook point is a different site in this "
            "family); use --backend native")
    return engine


def _float(x):
    return x.float() if isinstance(x, torch.Tensor) else None
