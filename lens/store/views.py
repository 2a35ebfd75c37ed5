"""Views of a store that analyses read through: one site's layers, and which tokens enter.

A :class:`LayerView` is the one way to read "every layer of one site": a lazy sequence of
``(token, d_model)`` tensors, one per layer, read when indexed (``view[i]`` is the ``i``-th layer of
``view.layers``; ``view.at(layer)`` by layer id), on the store's device. It can be restricted to
rows (``view.take(rows)``, a boolean mask or store row indices) and cast (``view.astype(dtype)``)
without reading anything; ``view.load()`` materialises it as a ``{layer: tensor}`` dict for code
that reads each layer many times (the lens decodes layer by layer in chunks).

Axis names: ``layer`` follows ``view.layers``; ``token`` is the store's rows in store order, or the
rows given to :meth:`LayerView.take`, in that order.

:func:`token_mask` is the one definition of which tokens enter an analysis: special tokens
(BOS/CLS/SEP) are left out by default, and optionally the first window positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lens.errors import LensInputError
from lens.sites import Site


def token_mask(tokens: dict, drop_special: bool = True, min_pos: int = 0) -> np.ndarray:
    """Boolean mask over a token table's rows: which tokens enter an analysis.

    ``drop_special`` leaves out BOS/CLS/SEP (their states are huge outliers and predict nothing);
    ``min_pos`` leaves out window positions below it. The first position of a causal model's window
    is an attention sink with "massive activations" (Xiao et al. 2023; Sun et al. 2024): in
    SmolLM2-135M its norm is ~100x the others', so a few such tokens would dominate the top-PC share,
    the mean cosine and the linearity fit; identical first tokens also give identical states.
    """
    n = len(tokens["token_id"])
    mask = np.ones(n, dtype=bool)
    if drop_special and "special" in tokens:
        mask &= ~np.asarray(tokens["special"], dtype=bool)
    if min_pos > 0:
        mask &= np.asarray(tokens["pos"]) >= min_pos
    if not mask.any():
        raise LensInputError(
            f"none of the store's {n} tokens is left after dropping special tokens and positions < {min_pos}; "
            "expected some text tokens")
    return mask


def _as_rows(rows) -> np.ndarray | None:
    if rows is None:
        return None
    rows = np.asarray(rows)
    if rows.dtype == bool:
        return np.nonzero(rows)[0]
    return rows.astype(np.int64, copy=False)


class LayerView(Sequence):
    """Lazy ``(layer, token, d_model)`` view of one site of a store (see the module docstring)."""

    def __init__(self, store, site: "str | Site", layers: Sequence[int] | None = None, rows=None, dtype=None):
        self.store = store
        self.site = store.manifest.site(site)  # a site the store does not hold: one line listing its sites
        stored = store.layers(self.site)
        self.layers = list(stored if layers is None else layers)
        missing = [l for l in self.layers if l not in stored]
        if missing:
            where = f"store {store.root}" if store.root is not None else "the store"
            raise LensInputError(f"{where} lacks layers {missing} of {self.site.value} (has {stored})")
        self.rows = _as_rows(rows)
        self.dtype = dtype

    # ------------------------------------------------------------------ sequence
    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> torch.Tensor:
        if isinstance(i, slice):
            raise TypeError("index a LayerView by one position; use .layers for its layer ids")
        return self.at(self.layers[i])

    def at(self, layer: int) -> torch.Tensor:
        """The states of layer id ``layer``: (token, d_model) on the store's device."""
        if self.rows is not None and getattr(self.store, "_arrays", None) is None and self.store.root is not None:
            X = self.store.get(layer=layer, site=self.site, rows=self.rows)  # only these rows are read
        else:
            X = self.store.get(layer=layer, site=self.site)
            if self.rows is not None:
                X = X.index_select(0, self._rows_on(X.device))
        return X if self.dtype is None else X.to(self.dtype)

    def _rows_on(self, device) -> torch.Tensor:
        """The row indices on ``device``, sent there once (not once per layer read)."""
        cached = getattr(self, "_rows_cache", None)
        if cached is None or cached.device != device:
            cached = self._rows_cache = torch.as_tensor(self.rows, device=device)
        return cached

    @property
    def n_tokens(self) -> int:
        return self.store.n_tokens if self.rows is None else len(self.rows)

    # ------------------------------------------------------------------ derived views (nothing read)
    def take(self, rows) -> "LayerView":
        """The same layers over ``rows`` (a boolean mask over this view's tokens, or their indices)."""
        rows = _as_rows(rows)
        if self.rows is not None:
            rows = self.rows[rows]
        return LayerView(self.store, self.site, self.layers, rows, self.dtype)

    def astype(self, dtype) -> "LayerView":
        return LayerView(self.store, self.site, self.layers, self.rows, dtype)

    def load(self) -> dict:
        """Every layer read now: ``{layer id: (token, d_model) tensor}``."""
        return {l: self.at(l) for l in self.layers}

    def lazy(self) -> dict:
        """Every layer as a :class:`LayerRows` (nothing read): ``{layer id: LayerRows}``, for code that
        indexes each layer by rows (``states[l][lo:hi]``, ``states[l][idx]``) and so holds one chunk of one
        layer at a time, not the whole sample."""
        return {l: LayerRows(self, l) for l in self.layers}

    def __repr__(self) -> str:
        rows = "all" if self.rows is None else len(self.rows)
        return f"LayerView({self.site.value}, layers={self.layers}, rows={rows}, dtype={self.dtype})"


class LayerRows:
    """One layer of a :class:`LayerView`, read only where indexed: ``rows[lo:hi]`` or ``rows[idx]`` (indices
    into the view's tokens, or a boolean mask over them) is a ``(token, d_model)`` tensor of those rows
    (the view's dtype, on the store's device); ``len(rows)`` is the view's token count. What analyses that
    read a sample chunk by chunk take where a whole layer in memory would not fit."""

    def __init__(self, view: LayerView, layer: int):
        self.view, self.layer = view, layer

    def __len__(self) -> int:
        return self.view.n_tokens

    def __getitem__(self, key) -> torch.Tensor:
        if isinstance(key, slice):
            key = np.arange(len(self))[key]
        elif isinstance(key, torch.Tensor):
            key = key.cpu().numpy()
        key = np.asarray(key)
        if key.ndim != 1:
            raise TypeError(f"index a LayerRows by a slice or a 1-D array of rows; got shape {key.shape}")
        return self.view.take(key).at(self.layer)

    def __repr__(self) -> str:
        return f"LayerRows({self.view.site.value}, layer={self.layer}, tokens={len(self)})"
