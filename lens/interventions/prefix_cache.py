"""Run a batch of prompts' prefixes once, then their last token many times: the model's own KV cache.

An edit of the last token's state (steering it at block ``l``, say) changes nothing at the earlier
positions of a causal model — they never attend to the last token — so every block after ``l``
only has to be re-run for that one position, attending to the keys and values the clean pass left
in the cache. :class:`PrefixCache` left-pads a batch of prompts (every last token in the last
column), runs the prefixes once with ``use_cache=True`` through the model's base (no head), and
:meth:`PrefixCache.last_state` runs the last column alone against that cache — under whatever hooks
the caller holds open — then crops the cache back, so it serves any number of edits.

Only the public transformers interface is used (the cache argument — ``cache`` from transformers
5.24, ``past_key_values`` before — ``position_ids`` counted from the attention mask, the cache's
``crop``); a family whose model takes none of these, or whose
cached step does not reproduce the whole forward pass, is the caller's to detect and route around
(:func:`lens.interventions.steering.steering_sweep` checks its first batch against whole forward passes in
float32 and falls back).
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch

from lens.capturing.batches import left_padded, pad_id

__all__ = ["PrefixCache", "left_padded"]


class PrefixCache:
    """Prompts ``ids`` (token ids, each at least 2) with their prefixes run once on ``model``."""

    @torch.inference_mode()
    def __init__(self, model, ids: Sequence[Sequence[int]]):
        if not ids or min(len(c) for c in ids) < 2:
            raise ValueError("every prompt needs at least 2 tokens: a prefix to cache and a last token")
        x, mask, pos = left_padded(ids, pad_id(model.tokenizer))
        dev = model.device
        self._base = model.hf_model.base_model
        params = inspect.signature(self._base.forward).parameters
        self._arg = next((a for a in ("cache", "past_key_values") if a in params), None)
        if self._arg is None or "position_ids" not in params:
            raise ValueError(f"{model.model_id}: the model's forward takes no KV cache or no position ids")
        out = self._base(input_ids=x[:, :-1].to(dev), attention_mask=mask[:, :-1].to(dev),
                         position_ids=pos[:, :-1].to(dev), use_cache=True)
        self._cache = getattr(out, self._arg, None)
        if self._cache is None or not callable(getattr(self._cache, "crop", None)):
            raise ValueError(f"{model.model_id}: the model returned no croppable KV cache")
        self._step = dict(input_ids=x[:, -1:].to(dev), attention_mask=mask.to(dev), position_ids=pos[:, -1:].to(dev))

    @torch.inference_mode()
    def last_state(self) -> torch.Tensor:
        """(batch, d_model): the base model's output (final norm applied) at each prompt's last
        token, computed from the cache; hooks open around the call see a sequence of one position."""
        try:
            out = self._base(**{self._arg: self._cache}, use_cache=True, **self._step)
        finally:
            self._cache.crop(-1)  # drop the last token again (a negative count removes that many)
        return out.last_hidden_state[:, -1]
