"""nnsight backend: one trace per batch, saving each requested module's input or output.

The same code path serves a local model and NDIF: ``remote=True`` is passed straight to
``trace`` so a user with NDIF access captures from models too large for their machine.
nnsight requires values to be requested in execution order, so taps are sorted by
(layer, position in the block), the position the site map's probe observed for this family.
"""

from __future__ import annotations

import copy
import warnings

import torch

from lens.arch.taps import INPUT, as_tokens
from lens.sites import HookSite, Site


def execution_order(hook: HookSite, site_map) -> tuple:
    if hook.site is Site.EMBED:
        return (-1, -1)
    if hook.site is Site.FINAL_NORM:
        return (10**9, 0)
    return (hook.layer, site_map.order.get(hook.site, 0))


def _envoy(root, path: str):
    node = root
    for part in path.split("."):
        if part.isdigit():
            node = node[int(part)]
        else:  # nnsight serves .input/.output itself; submodules of those names become E_<name>
            node = getattr(node, f"E_{part}" if part in ("input", "output") else part)
    return node


class NNsightBackend:
    name = "nnsight"

    def __init__(self, model, hooks: list[HookSite], remote: bool = False):
        from nnsight import TransformersModel

        warnings.filterwarnings("ignore", message="Module .* has a submodule named", category=UserWarning)

        self.model = model
        self.remote = remote
        task = "text-generation" if model.is_causal else "feature-extraction"
        if remote:  # NDIF hosts the weights: name the hub id, nothing is loaded here
            self.lm = TransformersModel(model.model_id, task=task, tokenizer=model.tokenizer)
        else:  # nnsight rewires every module's forward: wrap a copy, leave the user's model as it was
            self.lm = TransformersModel(copy.deepcopy(model.hf_model), task=task, tokenizer=model.tokenizer)
            if not getattr(model.hf_model, "hf_device_map", None):  # split by accelerate: its hooks place it
                self.lm.to(model.device)  # nnsight dispatches to a GPU when it sees one; stay where the model is
        ordered = sorted(hooks, key=lambda h: execution_order(h, model.site_map))
        self.taps: list[tuple[tuple[str, str, bool], list[str]]] = []  # (path, kind, flat) -> keys reading it
        for h in ordered:
            t = model.site_map.tap(h)
            tap = (t.at(h.layer), t.kind, t.flat_tokens)
            if any(x[0] == tap for x in self.taps):
                next(x for x in self.taps if x[0] == tap)[1].append(h.key)
            else:
                self.taps.append((tap, [h.key]))

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, return_logits: bool = False):
        saved = []
        logits_proxy = None
        with torch.inference_mode():
            with self.lm.trace({"input_ids": input_ids, "attention_mask": attention_mask},
                               remote=self.remote, use_cache=False):
                for (path, kind, flat), keys in self.taps:
                    env = _envoy(self.lm, path)
                    value = env.input if kind == INPUT else env.output
                    value = value[0] if isinstance(value, (tuple, list)) else value
                    # copied where it is read: the model may change it in place later (Falcon's MLP output)
                    saved.append((keys, flat, value.clone().save()))
                if return_logits:
                    logits_proxy = self.lm.output.logits.save()
        store = {}
        for keys, flat, value in saved:
            value = as_tokens(value, *input_ids.shape, flat)
            for k in keys:
                store[k] = value
        return store, logits_proxy
