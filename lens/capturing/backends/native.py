"""Plain PyTorch forward hooks on the model's own modules, at the taps of its site map."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import contextmanager

import torch

from lens.model.arch.taps import INPUT, as_tokens, first_tensor, input_tensor
from lens.sites import HookSite


class _StopForward(Exception):
    """Raised by the last hook so that layers past the deepest requested site are not run."""


class NativeBackend:
    name = "native"

    def __init__(self, model, hooks: Iterable[HookSite]):
        self.model = model
        self.hooks = tuple(hooks)
        site_map = model.site_map
        self.taps = []  # (key, module, tap)
        self.scales = {}  # key -> the factor of a rescaled stream or scaled sub-block (site_map.scales)
        for h in self.hooks:
            tap = site_map.tap(h)
            self.taps.append((h.key, model.hf_model.get_submodule(tap.at(h.layer)), tap))
            if site_map.scale(h) != 1.0:
                self.scales[h.key] = site_map.scale(h)

    @contextmanager
    def _installed(self, store: dict, stop_early: bool, shape: tuple[int, int]):
        handles = []
        n_wanted = len({key for key, _, _ in self.taps})

        def record(key, value, tap):
            # a copy: a model may change the tensor in place after the hook (Falcon adds the attention
            # output into the MLP output's storage), which would change what was recorded
            x = as_tokens(value, *shape, tap.flat_tokens).detach()
            store[key] = x * self.scales[key] if key in self.scales else x.clone()
            if stop_early and len(store) == n_wanted:
                raise _StopForward

        try:
            for key, module, tap in self.taps:
                if tap.kind == INPUT:
                    def pre(mod, args, kwargs, key=key, tap=tap):
                        record(key, input_tensor(args, kwargs), tap)
                    handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                else:
                    def post(mod, args, output, key=key, tap=tap):
                        record(key, first_tensor(output), tap)
                    handles.append(module.register_forward_hook(post))
            yield
        finally:
            for h in handles:
                h.remove()

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, return_logits: bool = False):
        """States at every hook for one batch; ``logits`` too when asked (else the forward stops early)."""
        store: dict = {}
        logits = None
        with self._installed(store, stop_early=not return_logits, shape=tuple(input_ids.shape)):
            try:
                out = self.model.hf_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
                logits = getattr(out, "logits", None)
            except _StopForward:
                pass
        return store, logits
