"""nnsight backend: one trace per batch, saving each requested module's input or output.

The same code path serves a local model and NDIF: ``remote=True`` is passed straight to
``trace`` so a user with NDIF access captures from models too large for their machine. Remotely,
only what is asked for travels back: the real (unpadded) tokens of each requested site are selected
on the server, inside the trace, and the size of that download is estimated before the request is
sent — refused above ``LENS_NDIF_MAX_MB`` (default 4096) with the batch size that would fit.
``select=True`` runs the same server-side selection locally (how it is tested without NDIF).
nnsight requires values to be requested in execution order, so taps are sorted by
(layer, position in the block), the position the site map's probe observed for this family.
"""

from __future__ import annotations

import copy
import logging
import os
import warnings

import torch

from lens.arch.taps import INPUT, as_tokens
from lens.errors import LensInputError
from lens.sites import HookSite, Site

log = logging.getLogger(__name__)
DEFAULT_MAX_MB = 4096


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

    def __init__(self, model, hooks: list[HookSite], remote: bool = False, select: bool | None = None):
        from nnsight import TransformersModel

        warnings.filterwarnings("ignore", message="Module .* has a submodule named", category=UserWarning)

        self.model = model
        self.remote = remote
        self.select = remote if select is None else select  # gather the real tokens where the model runs
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
        n_exp = model.site_map.n_experts or 0
        self._widths = [n_exp if any(k.startswith(Site.ROUTER_LOGITS.value) for k in keys) and n_exp else model.d_model
                        for _, keys in self.taps]

    def estimate_bytes(self, n_tokens: int) -> int:
        """Bytes a trace sends back for ``n_tokens`` selected tokens (one value per tap and token)."""
        itemsize = torch.empty(0, dtype=self.model.dtype).element_size()
        return int(n_tokens) * sum(self._widths) * itemsize

    def _check_size(self, n_tokens: int, batch: int) -> None:
        limit = float(os.environ.get("LENS_NDIF_MAX_MB", DEFAULT_MAX_MB)) * 2**20
        size = self.estimate_bytes(n_tokens)
        log.info("nnsight %s request: %d tokens x %d sites -> about %.1f MB back", "remote" if self.remote else "local",
                 n_tokens, len(self.taps), size / 2**20)
        if size > limit:
            fit = max(1, int(batch * limit // size))
            raise LensInputError(
                f"one NDIF request would bring back about {size / 2**20:.0f} MB ({n_tokens} tokens x {len(self.taps)} "
                f"sites), over the {limit / 2**20:.0f} MB limit (LENS_NDIF_MAX_MB): use --batch-size {fit} or fewer, or "
                "fewer sites / layers")

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, return_logits: bool = False):
        saved = []
        logits_proxy = None
        index = None
        if self.select:  # flat positions of the real tokens: only those rows travel back
            index = attention_mask.reshape(-1).nonzero().squeeze(1)
            self._check_size(int(index.numel()), int(input_ids.shape[0]))
        with torch.inference_mode():
            with self.lm.trace({"input_ids": input_ids, "attention_mask": attention_mask},
                               remote=self.remote, use_cache=False):
                for (path, kind, flat), keys in self.taps:
                    env = _envoy(self.lm, path)
                    value = env.input if kind == INPUT else env.output
                    value = value[0] if isinstance(value, (tuple, list)) else value
                    if index is not None:  # selected on the server: (real tokens, width), already a copy
                        saved.append((keys, flat, value.reshape(-1, value.shape[-1]).index_select(0, index).save()))
                        continue
                    # copied where it is read: the model may change it in place later (Falcon's MLP output)
                    saved.append((keys, flat, value.clone().save()))
                if return_logits:
                    logits_proxy = self.lm.output.logits.save()
        store = {}
        for keys, flat, value in saved:
            if index is not None:  # back to (batch, seq, width), zeros at the padding nobody reads
                rows = torch.zeros((input_ids.numel(), value.shape[-1]), dtype=value.dtype, device=value.device)
                value = rows.index_copy_(0, index.to(value.device), value).reshape(*input_ids.shape, -1)
            value = as_tokens(value, *input_ids.shape, flat)
            for k in keys:
                store[k] = value
        return store, logits_proxy
