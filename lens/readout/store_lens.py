"""The logit lens of a store's tokens, each token decoded once per process.

Several studies decode the same stored states — the logit-lens study, and the logit-lens column of
prediction gains — and a main job runs them one after the other on one model and one store. A
token's lens metrics depend on that token's states only (:func:`lens.readout.logit_lens.token_metrics`), so
this module keeps them per (model, store, site) and row: a request decodes only the rows no earlier
request decoded, and builds its means over its own rows and mask from the kept per-token values.
Which rows a study draws is its own business; the saving is whatever its sample shares with others.

The reference distribution is the lens of the last layer's ``resid_post`` (the model's own output)
whatever the site (a store without ``resid_post``: the site's own last layer). Kept: at most :data:`MAX_ENTRIES` (model, store, site) entries, each a
few (layer, token) float32 arrays of the whole store (e.g. 12 MB for 20k tokens × 30 layers); an
entry holds its model and store, so an id is never reused while it lives. :func:`clear` empties it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from lens.errors import LensInputError
from lens.sites import DEFAULT_SITE, OUTPUT_SITE
from lens.readout.logit_lens import LensResult, TokenMetrics, model_readout, summarize, token_metrics

__all__ = ["store_logit_lens", "clear", "MAX_ENTRIES"]

MAX_ENTRIES = 4
MEMO_TOP_K = 10  # top-k kept per decoded row (the logit-lens study's and the explorer grid's), so a later
# request for a row's top-k does not decode it again; np.zeros pages in only the rows written
_MEMO: "OrderedDict[tuple, _Entry]" = OrderedDict()


@dataclass
class _Entry:
    model: object
    store: object
    done: np.ndarray  # (token,) bool: rows decoded
    metrics: TokenMetrics  # every token of the store, each one's top-k too; the rows not done are not decoded yet

    @property
    def top_k(self) -> int:
        return self.metrics.top_k

    def put(self, rows: np.ndarray, tok: TokenMetrics) -> None:
        self.metrics.put(rows, tok)  # the top-k too when decoded with every row's (see store_logit_lens)
        self.done[rows] = True


def clear() -> None:
    """Forget every kept per-token metric."""
    _MEMO.clear()


def _store_key(store):
    """A disk store is the same store while its sealed manifest is (its checksum); an in-memory
    store is the object itself."""
    sealed = store.manifest.checksum if store.root is not None else None
    return ("disk", str(store.root), sealed) if sealed else ("object", id(store))


def _entry(model, store, site: str, layers: list[int], top_k: int = MEMO_TOP_K) -> _Entry:
    key = (id(model), _store_key(store), site, tuple(layers))
    e = _MEMO.get(key)
    if e is not None and e.model is model and (key[1][0] == "disk" or e.store is store):
        _MEMO.move_to_end(key)
        return e
    e = _Entry(model=model, store=store, done=np.zeros(store.n_tokens, bool),
               metrics=TokenMetrics.undecoded(layers, store.n_tokens, top_k))
    _MEMO[key] = e
    while len(_MEMO) > MAX_ENTRIES:
        _MEMO.popitem(last=False)
    return e


def store_logit_lens(model, store, rows=None, *, site: str = DEFAULT_SITE, mask=None, topk_rows=None,
                     top_k: int = 10, chunk_size: int = 512, progress: bool = False) -> LensResult:
    """:func:`lens.readout.logit_lens.logit_lens` of every stored layer of ``site`` at store ``rows``
    (ascending indices; None = all), against the last layer's ``resid_post``; ``mask`` and
    ``topk_rows`` index ``rows``. Rows decoded by an earlier call on the same model, store and site
    are not decoded again, nor is their top-k (every decoded row keeps its top :data:`MEMO_TOP_K`; a larger
    ``top_k`` decodes the rows asked for again)."""
    n_all = store.n_tokens
    rows = np.arange(n_all) if rows is None else np.asarray(rows, dtype=np.int64)
    layers = list(store.layers(site))
    ref_site = OUTPUT_SITE.value if OUTPUT_SITE.value in [str(getattr(x, "value", x)) for x in store.sites] else site
    ref_layer = list(store.layers(ref_site))[-1]
    nt = np.asarray(store.tokens["next_token_id"], dtype=np.int64)
    e = _entry(model, store, site, layers, max(MEMO_TOP_K, top_k))
    readout = model_readout(model)

    def decode(need: np.ndarray, topk=None, k: int = top_k) -> TokenMetrics:
        # lazy layers: each chunk of rows is read from the store as it is decoded (one chunk of one layer
        # in float32 at a time, not every layer of the sample)
        states = store.view(site, layers=layers).astype(torch.float32).take(need).lazy()
        if site == ref_site:
            final = states[ref_layer]  # the same object: the lens decodes the last layer once
        else:
            final = store.view(ref_site, layers=[ref_layer]).astype(torch.float32).take(need).lazy()[ref_layer]
        return token_metrics(states, final, nt[need], readout, device=model.device, dtype=torch.float32,
                             chunk_size=chunk_size, top_k=k, topk_rows=topk, progress=progress)

    kept = np.zeros(0, np.int64) if topk_rows is None else np.asarray(topk_rows, dtype=np.int64)
    tk_ids = np.zeros((len(layers), kept.size, top_k), np.int32)
    tk_probs = np.zeros((len(layers), kept.size, top_k), np.float32)
    if kept.size:
        if kept.min() < 0 or kept.max() >= rows.size:
            raise LensInputError(f"topk_rows must index the {rows.size} rows; got range {kept.min()}..{kept.max()}")
    # one pass over the rows not decoded yet (every one keeps its top e.top_k), and, when more than that
    # is asked, the rows whose top-k is asked for
    deeper = top_k > e.top_k
    need = np.unique(np.concatenate([rows[~e.done[rows]], rows[kept] if deeper else kept[:0]]))
    if need.size:
        tok = decode(need, topk=np.arange(need.size), k=top_k if deeper else e.top_k)
        e.put(need, tok)
        if kept.size and deeper:
            tk_ids, tk_probs = tok.topk_ids[:, np.searchsorted(need, rows[kept])], \
                tok.topk_probs[:, np.searchsorted(need, rows[kept])]
    if kept.size and not deeper:
        tk_ids, tk_probs = e.metrics.topk_ids[:, rows[kept], :top_k], e.metrics.topk_probs[:, rows[kept], :top_k]
    tok = e.metrics.take(rows, kept, tk_ids, tk_probs)
    return summarize(tok, nt[rows], np.ones(rows.size, bool) if mask is None else np.asarray(mask, dtype=bool))
