"""Capture backends: each runs a batch and returns the states at the requested hook sites.

* ``native`` — plain PyTorch forward hooks on the Hugging Face modules (default, fastest; stops the
  forward pass once the deepest requested site has fired).
* ``transformer-lens`` — TransformerLens 4 ``TransformerBridge`` with ``run_with_cache``.
* ``nnsight`` — an nnsight ``LanguageModel`` trace; ``remote=True`` sends it to NDIF.

All return ``{hook.key: tensor (batch, seq, d_model)}`` for one padded batch.
"""

from __future__ import annotations

from lens.errors import LensInputError

BACKENDS = ("native", "transformer-lens", "nnsight")


def make_backend(name: str, model, hooks, **kwargs):
    key = str(name).lower().replace("_", "-")
    if key == "native":
        from lens.backends.native import NativeBackend

        return NativeBackend(model, hooks)
    if key in ("transformer-lens", "transformerlens", "tl"):
        from lens.backends.tl import TransformerLensBackend

        return TransformerLensBackend(model, hooks)
    if key == "nnsight":
        from lens.backends.nnsight_backend import NNsightBackend

        return NNsightBackend(model, hooks, **kwargs)
    raise LensInputError(f"unknown backend {name!r}: expected one of {', '.join(BACKENDS)}")
