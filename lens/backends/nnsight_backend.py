"""nnsight backend: one trace per batch, saving each requested module's input or output.

The same code path serves a local model and NDIF: ``remote=True`` is passed straight to
``trace`` so a user with NDIF access captures from models too large for their machine.
nnsight requires values to be requested in execution order, so taps are sorted by
(layer, position in the block) first.
"""

from __future__ import annotations

import copy
import warnings

import torch

from lens.sites import HookSite, Site, resolve_path

# Order of sites within one block as the forward pass reaches them.
_BLOCK_ORDER = {Site.EMBED: -1, Site.RESID_PRE: 0, Site.ATTN_OUT: 1, Site.RESID_MID: 2, Site.MLP_OUT: 3,
                Site.RESID_POST: 4, Site.FINAL_NORM: 99}


def execution_order(hook: HookSite) -> tuple:
    if hook.site is Site.EMBED:
        return (-1, -1)
    if hook.site is Site.FINAL_NORM:
        return (10**9, 0)
    return (hook.layer, _BLOCK_ORDER[hook.site])


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
            self.lm.to(model.device)  # nnsight dispatches to a GPU when it sees one; stay where the model is
        ordered = sorted(hooks, key=execution_order)
        self.taps: list[tuple[tuple[str, str], list[str]]] = []  # (path, kind) -> keys reading it
        for h in ordered:
            tap = resolve_path(model.hf_model, model.arch, h)
            if self.taps and self.taps[-1][0] == tap:
                self.taps[-1][1].append(h.key)
            elif any(t[0] == tap for t in self.taps):
                next(t for t in self.taps if t[0] == tap)[1].append(h.key)
            else:
                self.taps.append((tap, [h.key]))

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, return_logits: bool = False):
        saved = []
        logits_proxy = None
        with torch.inference_mode():
            with self.lm.trace({"input_ids": input_ids, "attention_mask": attention_mask},
                               remote=self.remote):
                for (path, kind), keys in self.taps:
                    env = _envoy(self.lm, path)
                    saved.append((keys, (env.input if kind == "input" else env.output).save()))
                if return_logits:
                    logits_proxy = self.lm.output.logits.save()
        store = {}
        for keys, value in saved:
            value = value[0] if isinstance(value, (tuple, list)) else value
            for k in keys:
                store[k] = value
        return store, logits_proxy
