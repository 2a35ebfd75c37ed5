"""States of character spans in short texts, at every layer — e.g. a target word in a sentence.

``span_states(model, texts, spans)`` tokenises each text with the model's tokenizer (its own special
tokens: BOS where it adds one, CLS/SEP for encoders), runs the model once per batch through the
same native hooks :func:`lens.capturing.capture` uses, and returns for each text the mean of the states of
the tokens that overlap its character span (a word split into several sub-tokens gets the mean of
its sub-token states, as in the contextual-embedding sense literature, e.g. Wiedemann et al. 2019).

Also ``last_token_states`` (the state at each text's last token: the prompt's decision point for the
knob study) — both are one function over a token-position selector.

Axes: returned arrays are (layer, text, d_model) float32 with layer 0 = the embedding output
(``embed`` site; the static baseline) and layer l + 1 = ``resid_post`` of block l.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from lens.capturing.backends import make_backend
from lens.capturing.batches import pad_id, padded_tensors
from lens.errors import LensInputError
from lens.model.loading import load_model
from lens.sites import HookSite, Site

log = logging.getLogger(__name__)

__all__ = ["span_states", "last_token_states", "tokenize_spans"]


def tokenize_spans(tokenizer, texts: Sequence[str], spans: Sequence[tuple[int, int]]):
    """Token ids per text and the token positions overlapping each span; LensInputError if a span
    covers no token."""
    if not getattr(tokenizer, "is_fast", False):
        raise LensInputError("span_states needs a fast tokenizer (character offsets); got a slow one")
    enc = tokenizer(list(texts), return_offsets_mapping=True)
    ids, positions = [], []
    for i, (text, (a, b)) in enumerate(zip(texts, spans)):
        if not 0 <= a < b <= len(text):
            raise LensInputError(f"span {i}: expected 0 <= start < end <= {len(text)}, got ({a}, {b})")
        offs = enc["offset_mapping"][i]
        pos = [j for j, (s, e) in enumerate(offs) if e > s and s < b and e > a]
        if not pos:
            raise LensInputError(f"span {i} ({text[a:b]!r} in {text!r}) covers no token")
        ids.append(list(enc["input_ids"][i]))
        positions.append(pos)
    return ids, positions


@torch.inference_mode()
def _states_at(model, ids: list[list[int]], positions: list[list[int]], batch_size: int, progress: bool,
               desc: str) -> np.ndarray:
    hooks = [HookSite(Site.EMBED, None)] + [HookSite(Site.RESID_POST, l) for l in range(model.n_layers)]
    engine = make_backend("native", model, hooks)
    pad = pad_id(model.tokenizer)
    out = np.zeros((len(hooks), len(ids), model.d_model), dtype=np.float32)
    order = np.argsort([len(x) for x in ids], kind="stable")  # similar lengths together: less padding
    bar = tqdm(total=len(ids), desc=desc, unit="text", disable=not progress)
    for lo in range(0, len(ids), batch_size):
        rows = order[lo:lo + batch_size]
        x, mask = padded_tensors([ids[r] for r in rows], pad)  # right padding: real tokens never see the pads
        states, _ = engine.run(x.to(model.device), mask.to(model.device))
        for h_i, h in enumerate(hooks):
            s = states[h.key].float()
            for i, r in enumerate(rows):
                out[h_i, r] = s[i, positions[r]].mean(0).cpu().numpy()
        bar.update(len(rows))
    bar.close()
    return out


def span_states(model, texts: Sequence[str], spans: Sequence[tuple[int, int]], *, batch_size: int = 16,
                progress: bool = False) -> np.ndarray:
    """(layer + 1, text, d_model): embedding then every block's resid_post, mean over the span's tokens."""
    model = load_model(model)
    if len(texts) != len(spans) or not texts:
        raise LensInputError(f"expected one span per text and at least one text, got {len(texts)} texts "
                             f"and {len(spans)} spans")
    ids, positions = tokenize_spans(model.tokenizer, texts, spans)
    return _states_at(model, ids, positions, batch_size, progress, "span states")


def last_token_states(model, texts: Sequence[str], *, batch_size: int = 16, progress: bool = False,
                      add_special_tokens: bool = False) -> np.ndarray:
    """(layer + 1, text, d_model) at each text's last token (prompts usually carry their own
    special tokens from a chat template, hence ``add_special_tokens=False``)."""
    model = load_model(model)
    if not texts:
        raise LensInputError("expected at least one text, got none")
    ids = [model.tokenizer(t, add_special_tokens=add_special_tokens)["input_ids"] for t in texts]
    if any(len(x) == 0 for x in ids):
        raise LensInputError("expected non-empty texts, got one that tokenises to nothing")
    return _states_at(model, ids, [[len(x) - 1] for x in ids], batch_size, progress, "last-token states")
