"""TransformerLens 4 ``TransformerBridge`` backend.

The bridge replaces submodules of the model it wraps, so it wraps a deep copy: the user's model
stays untouched. Hook names come from :data:`TRANSFORMER_LENS_HOOKS`, the only hook-name strings
outside :mod:`lens.model.arch.names`.

The bridge's hook points are its own reading of each family: :func:`lens.capturing.backends.make_backend`
checks them against the model's site map on a probe batch before any capture.
"""

from __future__ import annotations

from collections.abc import Iterable
import copy

import torch

from lens.errors import LensInputError
from lens.sites import HookSite, Site

# TransformerLens (TransformerBridge) hook names for our sites.
TRANSFORMER_LENS_HOOKS: dict[Site, str] = {
    Site.EMBED: "blocks.0.hook_resid_pre",
    Site.RESID_PRE: "blocks.{l}.hook_resid_pre",
    Site.RESID_MID: "blocks.{l}.hook_resid_mid",
    Site.RESID_POST: "blocks.{l}.hook_resid_post",
    Site.ATTN_OUT: "blocks.{l}.hook_attn_out",
    Site.MLP_OUT: "blocks.{l}.hook_mlp_out",
    Site.FINAL_NORM: "ln_final.hook_out",  # hook_normalized is before the weight
}


def transformer_lens_hook(hook: HookSite) -> str:
    name = TRANSFORMER_LENS_HOOKS.get(hook.site)
    if name is None:
        raise LensInputError(f"TransformerLens has no hook for site {hook.site.value!r}; use --backend native")
    return name.format(l=hook.layer if hook.layer is not None else 0)


class TransformerLensBackend:
    name = "transformer-lens"

    def __init__(self, model, hooks: Iterable[HookSite]):
        from transformer_lens.model_bridge.sources._bridge_builder import (  # lazy: import cost (~2 s)
            build_bridge_from_module)

        self.model = model
        self.hooks = tuple(hooks)
        hf = copy.deepcopy(model.hf_model)
        arch = (getattr(hf.config, "architectures", None) or [type(hf).__name__])[0]
        try:
            self.bridge = build_bridge_from_module(hf, arch, hf_config=hf.config, tokenizer=model.tokenizer)
        except Exception as exc:  # TransformerLens raises many types for unsupported models
            raise LensInputError(
                f"TransformerLens cannot wrap {model.model_id} ({arch}): {exc}; use --backend native"
            ) from None
        self.names: dict[str, list[str]] = {}
        for h in self.hooks:  # embed and resid_pre.0 read the same hook
            model.site_map.tap(h)  # a site absent in the family is refused here too
            self.names.setdefault(transformer_lens_hook(h), []).append(h.key)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, return_logits: bool = False):
        logits, cache = self.bridge.run_with_cache(
            input_ids, attention_mask=attention_mask, names_filter=lambda n: n in self.names, use_cache=False)
        store = {key: cache[name] for name, keys in self.names.items() for key in keys}
        return store, (logits if return_logits else None)
