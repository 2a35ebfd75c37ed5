"""Which rows of a token table a study uses: units, splits and samples, one definition each.

Every function takes the store's token table (``store.tokens``: numpy columns doc, window, pos, ...)
or plain arrays and returns store rows (ascending int64 arrays) or per-row labels; nothing here
reads activations. Randomness is seeded (``numpy.random.default_rng(seed)``) so a result can be
reproduced from its config.

- A *unit* is what stays together when tokens are split or resampled: a document, or a capture
  window when the corpus has too few documents for a split (:func:`split_units`).
- Samples of text keep whole windows (:func:`sample_windows`, :func:`pick_windows`) or whole units
  (:func:`sample_units`), so the explorer's token view shows readable text and every position in a
  window is represented; :func:`sample_rows` draws single rows where that does not matter.
"""

from __future__ import annotations

import numpy as np

from lens.errors import LensInputError

SPLIT_CHOICES = ("auto", "doc", "window")


def window_ids(tokens: dict) -> np.ndarray:
    """Per row: an id of its capture window, unique across documents (windows are numbered per
    document in some stores, so (doc, window) pairs are numbered)."""
    pairs = np.stack([np.asarray(tokens["doc"]), np.asarray(tokens["window"])], 1)
    return np.unique(pairs, axis=0, return_inverse=True)[1].reshape(-1)


def window_bounds(tokens: dict) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the runs of rows that share a window, in store order."""
    win = np.asarray(tokens["window"])
    if not win.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.r_[0, np.nonzero(win[1:] != win[:-1])[0] + 1]
    return starts, np.r_[starts[1:], win.size]


def split_units(tokens: dict, split_by: str = "auto", min_docs: int = 10) -> tuple[np.ndarray, str]:
    """Per row: the unit a split or bootstrap keeps together, and its kind ("doc" or "window").

    ``split_by="auto"`` takes documents when there are at least ``min_docs`` of them, else windows.
    """
    if split_by not in SPLIT_CHOICES:
        raise LensInputError(f"split_by: expected auto, doc or window, got {split_by!r}")
    if split_by == "auto":
        split_by = "doc" if len(np.unique(tokens["doc"])) >= min_docs else "window"
    if split_by == "doc":
        return np.asarray(tokens["doc"]), "doc"
    return window_ids(tokens), "window"


def held_out(units: np.ndarray, fraction: float = 0.2, seed: int = 0) -> np.ndarray:
    """Boolean mask of held-out rows: ``fraction`` of the units (at least one), chosen whole."""
    uniq = np.unique(units)
    rng = np.random.default_rng(seed)
    n_test = max(1, int(round(len(uniq) * fraction)))
    return np.isin(units, rng.choice(uniq, size=n_test, replace=False))


def pick_windows(lengths, max_tokens: int, seed: int = 0) -> np.ndarray | None:
    """Indices (ascending) of whole windows, drawn at random until their lengths add up to at least
    ``max_tokens``; None when all of them hold no more than that (use every window)."""
    if max_tokens is not None and max_tokens < 0:
        raise LensInputError(f"a token budget must be >= 0 (0 = all tokens); got {max_tokens}")
    lengths = np.asarray(lengths, dtype=np.int64)
    if not max_tokens or lengths.sum() <= max_tokens:
        return None
    order = np.random.default_rng(seed).permutation(len(lengths))
    cum = np.cumsum(lengths[order])
    return np.sort(order[: int(np.searchsorted(cum, max_tokens)) + 1])


def sample_windows(tokens: dict, max_tokens: int, seed: int = 0) -> np.ndarray | None:
    """Rows of whole windows drawn at random (:func:`pick_windows`, kept in store order), cut at
    ``max_tokens`` rows; None when the table has no more than that (use every row)."""
    starts, ends = window_bounds(tokens)
    chosen = pick_windows(ends - starts, max_tokens, seed)
    if chosen is None:
        return None
    return np.concatenate([np.arange(starts[w], ends[w]) for w in chosen])[:max_tokens]


def sample_units(units: np.ndarray, keep: np.ndarray, max_rows: int, seed: int = 0) -> np.ndarray:
    """Rows of whole units (documents or windows) among ``keep``, units in random order, until at
    least ``max_rows`` rows are taken."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(np.unique(units[keep]))
    chosen, total = [], 0
    counts = np.bincount(units[keep])
    for u in order:
        if total >= max_rows:
            break
        chosen.append(u)
        total += counts[u]
    return np.flatnonzero(keep & np.isin(units, chosen))


def sample_split_units(tokens: dict, keep: np.ndarray, split_by: str, min_docs: int, max_rows: int,
                       seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """``(rows, units, kind)`` for a probe fitted on a sample: whole units drawn by :func:`sample_units`
    and the unit (:func:`split_units`) a split keeps together. With ``split_by="auto"`` documents are
    the units only when the *sample* holds ``min_docs`` of them too, else windows are drawn instead:
    a store of a few long documents (books, a 3000-token article) gives a 4000-token sample of two
    documents, too few to split into train, validation and test."""
    units, kind = split_units(tokens, split_by, min_docs)
    rows = sample_units(units, keep, max_rows, seed)
    if split_by == "auto" and kind == "doc" and len(np.unique(units[rows])) < min_docs:
        units, kind = window_ids(tokens), "window"
        rows = sample_units(units, keep, max_rows, seed)
    return rows, units, kind


def sample_rows(rows: np.ndarray, max_rows: int, seed: int = 0) -> np.ndarray:
    """At most ``max_rows`` of ``rows`` drawn at random without replacement, ascending (0 = all)."""
    rows = np.asarray(rows)
    if max_rows and rows.size > max_rows:
        return np.sort(np.random.default_rng(seed).choice(rows, size=max_rows, replace=False))
    return rows


def sample_mask(store, drop_special: bool, min_pos: int, max_tokens: int, seed: int = 0) -> tuple[np.ndarray, dict | None]:
    """The rows (ascending) a study analyses and, when they are a sample, its description for the
    result: whole windows of ``store.mask(drop_special, min_pos)`` drawn at random (``seed``) until
    ``max_tokens`` rows (:func:`sample_units`); every row of the mask when it holds no more (or
    ``max_tokens`` is 0), and then None."""
    mask = store.mask(drop_special, min_pos)
    n = int(mask.sum())
    if not max_tokens or n <= max_tokens:
        return np.flatnonzero(mask), None
    rows = sample_units(window_ids(store.tokens), mask, max_tokens, seed)
    return rows, {"tokens": int(len(rows)), "of": n, "unit": "window", "seed": int(seed),
                  "sample_tokens": int(max_tokens)}
