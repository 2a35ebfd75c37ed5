"""One read API for stores on disk (memory-mapped), in host memory, or on a GPU."""

from __future__ import annotations

from pathlib import Path
import math

import numpy as np
import torch

from lens.runtime.devices import parse_device
from lens.errors import LensInputError, StoreCorruptError
from lens.sites import DEFAULT_SITE, HookSite, Site, parse_layers
from lens.store.format import TOKEN_COLUMNS, count_nonfinite, from_storage, load_manifest, storage_np_dtype
from lens.store.manifest import Manifest, ShardEntry
from lens.store.shardfiles import ShardFiles
from lens.store.views import LayerView, token_mask
from lens.store.stats import store_stats
from lens.store.contexts import token_contexts
from lens.store.exchange.lazy import to_dask, to_xarray
from lens.store.verify import verify_files


class Store:
    """Activations at hook sites for a table of tokens.

    ``get(layer, site)`` returns a tensor (token, d_model) on the store's device; ``tokens`` is a
    dict of numpy columns (one row per token): doc, window, pos, doc_pos, token_id, token,
    next_token_id, special.

    ``manifest`` is the store's :class:`lens.store.manifest.Manifest` (a frozen value; a JSON dict is parsed
    unchecked: a store built in memory from known parts). Methods taking a site take a :class:`Site` or its name; a
    name the store does not hold is one line listing its sites.
    """

    def __init__(self, manifest: Manifest | dict, tokens: dict, *, root: Path | None = None, arrays=None,
                 device: str | None = None, verify: bool = True):
        self.manifest = Manifest.from_dict(manifest, validate=False)  # a value is kept as it is
        self.tokens = tokens
        self.root = Path(root) if root is not None else None
        self.device = device
        self._arrays = arrays  # site name -> tensor (layers, tokens, d) when held in memory
        self._verify = verify
        self._files = ShardFiles(self.root, self.manifest, verify) if self.root is not None else None

    # ------------------------------------------------------------------ description
    @property
    def model_id(self) -> str:
        return self.manifest.model_id

    @property
    def card(self):
        """The typed model card of the model this store was captured from (:class:`lens.model.card.ModelCard`)."""
        return self.manifest.card

    @property
    def d_model(self) -> int:
        return self.manifest.d_model

    @property
    def n_tokens(self) -> int:
        return self.manifest.n_tokens

    @property
    def dtype(self) -> str:
        return self.manifest.dtype

    @property
    def sites(self) -> tuple[Site, ...]:
        """The stored sites, in the manifest's order (each a :class:`Site`, which reads as its name)."""
        return self.manifest.site_list

    @property
    def complete(self) -> bool:
        return self.manifest.complete

    def layers(self, site: "str | Site" = DEFAULT_SITE) -> list[int]:
        return [int(l) for l in self.manifest.layers_of(site) if l is not None]

    def has(self, site: "str | Site", layer: int | None = None) -> bool:
        try:
            layers = self.manifest.layers_of(site)
        except LensInputError:
            return False
        return layer is None or layer in layers

    def __repr__(self) -> str:
        where = self.device or ("disk" if self.root else "memory")
        return (f"Store({self.model_id}, {self.n_tokens} tokens, sites={ {s.value: list(l) for s, l in self.manifest.sites.items()}!r}, "
                f"dtype={self.dtype}, on {where})")

    # ------------------------------------------------------------------ reading
    def _index(self, site: "str | Site", layer: int | None) -> int:
        parsed = self.manifest.site(site)
        name, layers = parsed.value, list(self.manifest.sites[parsed])
        if not parsed.per_layer:
            return 0
        if layer is None:
            raise LensInputError(f"site {name!r} needs a layer (stored: {layers})")
        n_layers = self.manifest.n_layers
        if layer < 0:
            layer += n_layers
        if layer not in layers:
            raise LensInputError(
                f"layer {layer} of {name} is not in this store: stored layers are {layers}")
        return layers.index(layer)

    def get(self, site: "str | Site" = DEFAULT_SITE, layer: int | None = None, *, dtype=None,
            rows=None) -> torch.Tensor:
        """States of every token at ``site``/``layer`` (the order of :class:`lens.sites.HookSite`): a tensor
        (token, d_model); with ``rows`` (token indices) only those rows, in that order — read shard by
        shard from disk, so memory holds the rows asked for (and one shard's layer block while its
        checksum is checked), not the layer. ``get(layer=3)`` reads layer 3 of the default site."""
        if site is None or (isinstance(site, (int, np.integer)) and not isinstance(site, bool)):
            raise TypeError(f"Store.get takes (site, layer), as HookSite does: got the layer {site} first; write "
                            f"get(SITE, {site}) or get(layer={site})")
        name = self.manifest.site(site).value
        idx = self._index(name, layer)
        if rows is not None and self._arrays is None:
            out = self._get_rows(name, idx, np.asarray(rows, dtype=np.int64))
            if self.device:
                out = out.to(self.device)
        elif self._arrays is not None:
            out = self._arrays[name][idx]
            if rows is not None:
                out = out.index_select(0, torch.as_tensor(np.asarray(rows, dtype=np.int64), device=out.device))
        else:
            parts = [self._shard_layer(s, name, idx) for s in self.manifest.shards]
            if not parts:
                raise LensInputError(f"store {self.root} holds no complete shard yet")
            out = from_storage(np.concatenate(parts) if len(parts) > 1 else np.array(parts[0]), self.dtype)
            if self.device:
                out = out.to(self.device)
        return out if dtype is None else out.to(dtype)

    def _get_rows(self, name: str, idx: int, rows: np.ndarray) -> torch.Tensor:
        if rows.size and (rows.min() < 0 or rows.max() >= self.n_tokens):
            raise LensInputError(f"rows must lie in 0..{self.n_tokens - 1}, got {rows.min()}..{rows.max()}")
        ordered = bool(np.all(rows[1:] > rows[:-1]))
        uniq, inv = (rows, None) if ordered else np.unique(rows, return_inverse=True)
        parts, start = [], 0
        for shard in self.manifest.shards:
            n = shard.n_tokens
            lo, hi = np.searchsorted(uniq, [start, start + n])
            if hi > lo:
                parts.append(np.asarray(self._shard_layer(shard, name, idx)[uniq[lo:hi] - start]))
            start += n
        width = self.manifest.width(name)
        data = np.concatenate(parts) if parts else np.zeros((0, width), dtype=self._storage_dtype())
        out = from_storage(data, self.dtype)
        return out if inv is None else out.index_select(0, torch.from_numpy(inv.reshape(-1)))

    def _storage_dtype(self):
        return storage_np_dtype(self.dtype)

    def view(self, site: "str | Site" = DEFAULT_SITE, layers=None, rows=None, dtype=None):
        """Every (or the given) layer of ``site``, read lazily: :class:`lens.store.views.LayerView`."""
        return LayerView(self, site, layers, rows, dtype)

    def to_dask(self, site: "str | Site" = DEFAULT_SITE, layers=None):
        """``site``'s states as a lazy dask array (layer, token, d_model), one chunk per layer and shard
        (:mod:`lens.store.exchange.lazy`; bfloat16 widened exactly to float32)."""
        return to_dask(self, site, layers)

    def to_xarray(self, site: "str | Site" = DEFAULT_SITE, layers=None):
        """``site``'s states as a lazy ``xarray.DataArray``, its layers and token table as coordinates
        (:mod:`lens.store.exchange.lazy`)."""
        return to_xarray(self, site, layers)

    def mask(self, drop_special: bool = True, min_pos: int = 0) -> np.ndarray:
        """Which tokens enter an analysis (:func:`lens.store.views.token_mask`)."""
        return token_mask(self.tokens, drop_special, min_pos)

    def stats(self, site: "str | Site" = DEFAULT_SITE, drop_special: bool = True, min_pos: int = 0):
        """Per-layer statistics of ``site`` over the tokens of ``mask(drop_special, min_pos)``
        (:class:`lens.store.layer_stats.LayerStats`: count, mean, Σ unit rows, norms; no covariance): added
        up from the sums the capture wrote with each shard when the store has them and ``min_pos`` is
        0 or 1, else computed from the stored rows in one streaming pass (:mod:`lens.store.stats`)."""
        return store_stats(self, site, drop_special, min_pos)

    def has_stats(self, site: "str | Site" = DEFAULT_SITE) -> bool:
        """Whether every shard records the statistics of ``site`` (then :meth:`stats` reads no states)."""
        return self.root is not None and self.manifest.has_stats(self.manifest.site(site))

    def contexts(self, rows, width: int = 8) -> list:
        """Each row's tokens around it in its window (:func:`lens.store.contexts.token_contexts`)."""
        return token_contexts(self.tokens, rows, width)

    def _shard_layer(self, shard: ShardEntry, site: str, idx: int) -> np.ndarray:
        return self._files.layer_block(shard, site, idx)

    def verify(self) -> None:
        """Check every byte of every shard against its checksum (raises StoreCorruptError);
        :func:`lens.store.verify.verify_store` does the same and reports every problem."""
        if self.root is None:
            return

        problems = verify_files(self.root, self.manifest)
        if problems:
            raise StoreCorruptError(problems[0])

    def nonfinite(self, site: "str | Site" = DEFAULT_SITE) -> dict | None:
        """layer -> count of non-finite values captured at ``site`` (layer ``None`` for single-position
        sites); ``None`` when the store does not record it (format 1)."""
        parsed = self.manifest.site(site)
        counts = self.manifest.nonfinite_of(parsed)
        if counts is None:
            return None
        return dict(zip(self.manifest.sites[parsed], counts))

    def require_usable(self, sites=(DEFAULT_SITE,), layers="all") -> None:
        """Refuse (``LensInputError``) a store an analysis must not read: one still incomplete, or one
        holding non-finite values at any of ``sites`` x ``layers``."""
        where = f"store {self.root}" if self.root is not None else "the captured store"
        if not self.complete:
            raise LensInputError(
                f"{where} is incomplete ({self.n_tokens} of {self.manifest.n_tokens_planned or '?'} tokens): "
                "finish it with `lens capture ... --resume` (same arguments) before analysing it")
        for s in sites:
            site = self.manifest.site(s).value
            counts = self.nonfinite(site)
            if not counts:
                continue
            wanted = set(parse_layers(layers, self.manifest.n_layers))
            bad = [(l, c) for l, c in counts.items() if c and (l is None or l in wanted)]
            if bad:
                (l0, c0), rest = bad[0], [l for l, _ in bad[1:]]
                at = f"{site}" if l0 is None else f"{site} layer {l0}"
                more = f" (and layer{'s' if len(rest) > 1 else ''} {', '.join(map(str, rest))})" if rest else ""
                raise LensInputError(
                    f"{where} holds {c0} non-finite values (NaN or inf) at {at}{more}: the model's states "
                    "overflow or are NaN there; recapture in float32, or analyse other layers")

    def to(self, device: str) -> "Store":
        """A copy of this store held in memory on ``device`` ("cpu" or "cuda"). Each layer is read and
        copied into its place on the device in turn: no stacked host copy of the whole store."""
        device = parse_device(device)
        arrays = {}
        for s in self.sites:
            layers = self.manifest.sites[s]
            out = None
            for i, l in enumerate(layers):
                x = self.get(s, l if s.per_layer else None)
                if out is None:
                    out = torch.empty((len(layers), *x.shape), dtype=x.dtype, device=device)
                out[i].copy_(x)
            arrays[s.value] = out
        return Store(self.manifest, self.tokens, root=self.root, arrays=arrays, device=device)

    def summary(self) -> list[dict]:
        """Per site and layer: mean norm, mean and max |x| over the tokens, and how many values are
        not finite (for `lens store info`), read a chunk of rows at a time (float64 sums); where the
        shards record statistics (:mod:`lens.store.stats`), also the mean cosine of token pairs and the
        top-3 rogue dimensions over the text tokens past position 0 (``mask(True, 1)``), read from them."""
        rows = []
        # counted in the data as read, even where the manifest records other counts (a store re-sealed with
        # NaN in it): describing such a store honestly is this summary's job; `lens store info` flags it
        files = ShardFiles(self.root, self.manifest, self._verify, check_nonfinite=False) if self._arrays is None else None
        for site in self.sites:
            if files is not None and not self.manifest.shards:
                raise LensInputError(f"store {self.root} holds no complete shard yet")
            stats = None
            if self.has_stats(site):
                try:
                    stats = self.stats(site, True, 1)
                except LensInputError:
                    stats = None
            for i, layer in enumerate(self.manifest.sites[site]):
                n, norms, total, max_abs, bad = 0, 0.0, 0.0, 0.0, 0
                for x in self._chunks(site, i, files):
                    x = x.to(torch.float32)
                    n += x.shape[0]
                    norms += float(x.norm(dim=-1).sum(dtype=torch.float64))
                    total += float(x.sum(dtype=torch.float64))
                    m = float(x.abs().max()) if x.numel() else 0.0
                    max_abs = m if math.isnan(m) or math.isnan(max_abs) else max(max_abs, m)
                    bad += count_nonfinite(x)
                row = {"site": site.value, "layer": layer, "mean_norm": norms / max(n, 1),
                       "mean": total / max(n * (x.shape[1] if n else 1), 1), "max_abs": max_abs, "nonfinite": bad}
                if stats is not None and stats.n >= 2 and not stats.n_zero[i]:
                    cc = stats.at(stats.layers[i]).cosine_contributions[0]
                    row.update(mean_cosine=float(cc.sum()), rogue_dims=np.argsort(-cc)[:3].tolist())
                rows.append(row)
        return rows

    def _chunks(self, site: str, idx: int, files=None, rows: int = 1 << 16):
        """Layer block ``idx`` of ``site``, a tensor of at most ``rows`` rows at a time, in token order
        (through ``files``, a :class:`ShardFiles`, when given: e.g. one that does not refuse a block whose
        non-finite count differs from the manifest's)."""
        if self._arrays is not None:
            X = self._arrays[Site.parse(site).value][idx]
            for lo in range(0, X.shape[0], rows):
                yield X[lo:lo + rows]
            return
        for shard in self.manifest.shards:
            block = files.layer_block(shard, site, idx) if files is not None else self._shard_layer(shard, site, idx)
            for lo in range(0, block.shape[0], rows):
                yield from_storage(np.asarray(block[lo:lo + rows]), self.dtype)


def _load_tokens(files: ShardFiles) -> dict:
    cols = {c: [] for c in TOKEN_COLUMNS}
    for shard in files.manifest.shards:
        for c in TOKEN_COLUMNS:
            cols[c].append(files.token_column(shard, c))
    out = {}
    for c, parts in cols.items():
        out[c] = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64 if c != "token" else str)
    return out


def open_store(path, device: str | None = None, verify: bool = True) -> Store:
    """Open a store folder. ``device=None`` memory-maps it from disk; ``"cpu"`` loads it into host
    memory; ``"cuda"`` loads it onto the GPU. Checksums are verified the first time each file is
    read (``verify=False`` skips that)."""
    root = Path(path)
    if device is not None:
        device = parse_device(device)
    if not root.exists():
        raise LensInputError(f"store not found: {root}")
    if not root.is_dir():
        raise LensInputError(f"{root} is not an activation store: expected a folder")
    manifest = load_manifest(root)  # parsed and checked once
    store = Store(manifest, {}, root=root, verify=verify)
    store.tokens = _load_tokens(store._files)
    if device is not None:
        return store.to(device)
    return store
