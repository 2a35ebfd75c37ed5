"""Only what is asked for, from a corpus, through nnsight — on NDIF (``remote=True``) or here.

Two questions a researcher asks of a model too large to capture whole:

* :func:`collect_stats` — per-layer statistics (:class:`lens.store.layer_stats.LayerStats`): every batch
  is reduced to sums inside the trace, where the model runs, and the sums are added up here in
  float64. What travels back per request is a few d-vectors per site (and half a d × d Gram matrix
  with ``cov=True``), whatever the number of tokens.
* :func:`collect_positions` — the states at some positions of each window only (``"last"``,
  ``[0, -1]``, ...; see :mod:`lens.store.positions`), gathered inside the trace.

``remote=False`` runs the identical trace through nnsight's local execution; ``remote="local"``
also serialises it as for NDIF and deserialises it with lens hidden (nnsight's dry run of a remote
request). ``remote=True`` needs the model's hub id and an NDIF API key (``nnsight.CONFIG``).
Before each request is sent, the bytes it brings back are estimated and a request over
``LENS_NDIF_MAX_MB`` is refused, naming what would fit (:mod:`lens.capturing.backends.nnsight_backend`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from lens.capturing.backends import make_backend
from lens.capturing.batches import pad_id
from lens.capturing.backends.server_side import MOMENTS, MOMENTS_COV, ROWS
from lens.capturing.capture import check_seq_len
from lens.capturing.spec import CAPTURE_DEFAULTS as _D, CaptureSpec
from lens.text.corpora import load_corpus, make_windows
from lens.errors import LensInputError
from lens.store.layer_stats import NO_LAYER, LayerStats, from_sums, merge
from lens.model.loading import load_model
from lens.capturing.pipeline import make_batch
from lens.store.positions import Positions, parse_positions
from lens.sites import expand_sites


@dataclass(frozen=True)
class Fetch:
    """What a reduced fetch of a corpus cost, shared by :class:`StatsRun` and :class:`PositionStates`.

    positions : "all" or the positions (among each window's real tokens) kept.
    n_requests : traces run (one per batch).
    bytes_back : bytes of the tensors the traces returned (measured).
    bytes_estimated : the estimate made before sending, summed over the requests.
    """

    model_id: str
    corpus: str
    positions: object
    n_requests: int
    bytes_back: int
    bytes_estimated: int


@dataclass(frozen=True)
class StatsRun(Fetch):
    """Statistics of a corpus (``stats``: {site: LayerStats}) and what fetching them cost (:class:`Fetch`)."""

    stats: dict


@dataclass(frozen=True)
class PositionStates(Fetch):
    """States at chosen positions of each window, and what fetching them cost (:class:`Fetch`).

    states : {hook key: (row, width) tensor}, rows in (window, position) order.
    tokens : {column: [row] array}: the corpus token table's rows (doc, window, pos, token_id, ...).
    """

    states: dict
    tokens: dict


def _plan(spec: CaptureSpec):
    """Check what a fetch takes and cut its windows (as :func:`lens.capturing.capture` cuts them for ``spec``)."""
    model = load_model(spec.model)
    if spec.batch_size < 1:
        raise LensInputError(f"batch_size must be at least 1, got {spec.batch_size}")
    check_seq_len(model, spec.seq_len)
    hooks = expand_sites(spec.sites, spec.layers, model.n_layers, model.site_map)
    corpus = load_corpus(spec.corpus)
    positions = parse_positions(spec.positions)
    win = make_windows(corpus, model.tokenizer, seq_len=spec.seq_len, max_tokens=spec.max_tokens,
                       is_causal=model.is_causal, sample=spec.sample, sample_seed=spec.sample_seed)
    engine = make_backend("nnsight", model, hooks, remote=spec.remote, select=True)
    return model, hooks, corpus, positions, win, engine


def _batches(model, win, batch_size):
    pad = pad_id(model.tokenizer)
    for lo in range(0, win.n_windows, batch_size):
        yield make_batch(win.input_ids, lo, min(lo + batch_size, win.n_windows), pad, model.device, pin=False)


def collect_stats(model, corpus=_D.corpus, sites: Sequence[str] = _D.sites, layers=_D.layers, *,
                  positions: Positions = _D.positions, cov: bool = True, remote: bool | str = _D.remote,
                  max_tokens: int | None = _D.max_tokens, seq_len: int = _D.seq_len, batch_size: int = _D.batch_size,
                  sample: str = _D.sample, sample_seed: int = _D.sample_seed, progress: bool = True) -> StatsRun:
    """Per-layer statistics of ``sites`` × ``layers`` over ``corpus``, reduced where the model runs.

    Windows are cut as :func:`lens.capturing.capture` cuts them (same ``seq_len``, ``max_tokens``, ``sample``), so the
    statistics equal those of the captured store's tokens at ``positions``. ``cov=False`` leaves out
    the d × d Gram sums (then no covariance or top-PC share)."""
    spec = CaptureSpec.from_flat(model=model, corpus=corpus, sites=sites, layers=layers, max_tokens=max_tokens,
                                 seq_len=seq_len, batch_size=batch_size, remote=remote, positions=positions,
                                 sample=sample, sample_seed=sample_seed)
    model, hooks, corpus, positions, win, engine = _plan(spec)
    groups: dict = {}  # site -> [(layer label, hook key)]
    for h in hooks:
        groups.setdefault(h.site.value, []).append((NO_LAYER if h.layer is None else h.layer, h.key))
    reduction = MOMENTS_COV if cov else MOMENTS
    total: dict = {}
    n_req = back = est = 0
    bar = tqdm(total=win.n_tokens, unit="tok", desc=f"stats {model.model_id}", disable=not progress)
    try:
        for batch in _batches(model, win, batch_size):
            got, sel = engine.run_stats(batch.ids, batch.mask, positions, cov)
            n_req, back, est = n_req + 1, back + engine.last_bytes, est + engine.estimate_bytes(sel.n, reduction)
            for site, members in groups.items():
                part = from_sums(site, [l for l, _ in members], sel.n, [got[k][0] for _, k in members],
                                 [got[k][1] for _, k in members] if cov else None)
                total[site] = merge(total[site], part) if site in total else part
            bar.update(batch.n)
    finally:
        bar.close()
    _require_rows(next(iter(total.values())).n if total else 0, positions)
    return StatsRun(stats=total, model_id=model.model_id, corpus=corpus.name, positions=positions, n_requests=n_req,
                    bytes_back=back, bytes_estimated=est)


def collect_positions(model, corpus=_D.corpus, sites: Sequence[str] = _D.sites, layers=_D.layers, *,
                      positions: Positions = "last", remote: bool | str = _D.remote,
                      max_tokens: int | None = _D.max_tokens, seq_len: int = _D.seq_len,
                      batch_size: int = _D.batch_size, sample: str = _D.sample, sample_seed: int = _D.sample_seed,
                      progress: bool = True) -> PositionStates:
    """The states of ``sites`` × ``layers`` at ``positions`` of every window (by default the last one: what
    is asked for when the whole store would not travel); only those rows travel."""
    spec = CaptureSpec.from_flat(model=model, corpus=corpus, sites=sites, layers=layers, max_tokens=max_tokens,
                                 seq_len=seq_len, batch_size=batch_size, remote=remote, positions=positions,
                                 sample=sample, sample_seed=sample_seed)
    model, hooks, corpus, positions, win, engine = _plan(spec)
    offsets = win.window_offsets()
    parts: dict = {h.key: [] for h in hooks}
    rows = []
    n_req = back = est = 0
    bar = tqdm(total=win.n_tokens, unit="tok", desc=f"positions {model.model_id}", disable=not progress)
    try:
        for batch in _batches(model, win, batch_size):
            got, sel = engine.run_rows(batch.ids, batch.mask, positions)
            n_req, back, est = n_req + 1, back + engine.last_bytes, est + engine.estimate_bytes(sel.n, ROWS)
            for k, v in got.items():
                parts[k].append(v.cpu())
            rows.append(offsets[batch.lo + sel.seq.numpy()] + sel.pos.numpy())
            bar.update(batch.n)
    finally:
        bar.close()
    rows = np.concatenate(rows).astype(np.int64)
    _require_rows(len(rows), positions)
    return PositionStates(states={k: torch.cat(v) for k, v in parts.items()},
                          tokens={c: np.asarray(v)[rows] for c, v in win.rows.items()}, model_id=model.model_id,
                          corpus=corpus.name, positions=positions, n_requests=n_req, bytes_back=back,
                          bytes_estimated=est)


def _require_rows(n: int, positions) -> None:
    if n == 0:
        raise LensInputError(f"no token of the corpus is at positions {positions}: the windows are shorter "
                             "(positions count each window's real tokens from 0, or from the end with -1)")
