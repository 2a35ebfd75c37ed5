"""Plain PyTorch forward hooks on the model's own modules."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from lens.sites import HookSite, resolve


class _StopForward(Exception):
    """Raised by the last hook so that layers past the deepest requested site are not run."""


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


class NativeBackend:
    name = "native"

    def __init__(self, model, hooks: list[HookSite]):
        self.model = model
        self.hooks = list(hooks)
        self.taps = [(h.key, *resolve(model.hf_model, model.arch, h)) for h in self.hooks]

    @contextmanager
    def _installed(self, store: dict, stop_early: bool):
        handles = []
        n_wanted = len({key for key, _, _ in self.taps})

        def record(key, value):
            store[key] = value.detach()
            if stop_early and len(store) == n_wanted:
                raise _StopForward

        try:
            for key, module, kind in self.taps:
                if kind == "input":
                    def pre(mod, args, kwargs, key=key):
                        record(key, args[0] if args else kwargs["hidden_states"])
                    handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                else:
                    def post(mod, args, output, key=key):
                        record(key, _first(output))
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
        with self._installed(store, stop_early=not return_logits):
            try:
                out = self.model.hf_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
                logits = getattr(out, "logits", None)
            except _StopForward:
                pass
        return store, logits
