"""What every study shares: the base config, model + store preparation, and timing."""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import lens
from lens.errors import LensInputError
from lens.sites import Site, parse_layers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StudyConfig:
    """Fields every study has. Studies subclass this with their own (all with defaults).

    ``store``: folder of an activation store to reuse; captured there first if it does not exist.
    """

    model: str = "smollm2-135m"
    corpus: str = "wiki-sample"
    max_tokens: int = 20_000
    seq_len: int = 128
    batch_size: int = 8
    device: str = "cpu"
    store: str | None = None
    seed: int = 0
    progress: bool = True
    dtype: str = "float32"


@functools.lru_cache(maxsize=2)
def cached_model(spec: str, device: str = "cpu") -> lens.LoadedModel:
    """Load once per process (the `study all` job runs many studies on one model)."""
    return lens.load_model(spec, device=device)


def prepare(config: StudyConfig, sites: Sequence[str] = ("resid_post",), layers="all", *,
            need_model: bool = True, transform=None, store_path: str | None = None):
    """Load the model and capture ``sites`` (or reuse ``config.store``). Returns (model, store).

    A reused store must come from the same model and hold every requested site and layer.
    """
    model = cached_model(config.model, config.device) if need_model or not config.store else None
    path = store_path if store_path is not None else config.store
    if path is not None and (Path(path) / "manifest.json").is_file():
        store = lens.open_store(path)
        check_store(store, config.model, sites, layers, model.n_layers if model else None)
        store.require_usable(sites, layers)  # incomplete, or NaN/inf at a layer: exit 2 naming it
        return model, store
    store = lens.capture(model, corpus=config.corpus, sites=list(sites), layers=layers,
                         max_tokens=config.max_tokens, seq_len=config.seq_len,
                         batch_size=config.batch_size, dtype=config.dtype, out=path,
                         progress=config.progress, transform=transform)
    store.require_usable(sites, layers)
    return model, store


def check_store(store: lens.Store, model_id: str, sites, layers, n_layers: int | None) -> None:
    if store.model_id != model_id:
        raise LensInputError(
            f"store {store.root} was captured from {store.model_id!r}, but this study runs {model_id!r}")
    n_layers = n_layers or int(store.manifest["model"]["n_layers"])
    for s in sites:
        site = Site.parse(s)
        if not store.has(site):
            raise LensInputError(f"store {store.root} lacks site {site.value!r} (has {', '.join(store.sites)})")
        if site.per_layer:
            missing = [l for l in parse_layers(layers, n_layers) if not store.has(site, l)]
            if missing:
                raise LensInputError(
                    f"store {store.root} lacks layers {missing} of {site.value} (has {store.layers(site)})")


def config_from_dict(cls, values: dict):
    """Build a frozen config from strings (command line) or values, converting by field type."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, raw in values.items():
        name = key.replace("-", "_")
        if name not in fields:
            raise LensInputError(f"{cls.__module__} has no parameter {key!r} (has {', '.join(fields)})")
        kwargs[name] = _convert(fields[name], raw)
    return cls(**kwargs)


def _convert(field, raw):
    if not isinstance(raw, str):
        return raw
    default = field.default
    kind = type(default) if default is not None and default is not dataclasses.MISSING else None
    ann = str(field.type)
    try:
        if kind is bool or ann == "bool":
            return raw.lower() in ("1", "true", "yes", "on")
        if kind is int or ann.startswith("int"):
            return int(raw)
        if kind is float or ann.startswith("float"):
            return float(raw)
        if kind is tuple or ann.startswith("tuple"):
            return tuple(x.strip() for x in raw.split(",") if x.strip())
    except ValueError:
        raise LensInputError(f"parameter {field.name}: expected {kind.__name__ if kind else ann}, got {raw!r}") from None
    if raw.lower() == "none" and "None" in ann:
        return None
    return raw


def probe_split_docs(docs, fraction: float = 0.2, seed: int = 0):
    """Boolean mask of held-out tokens, chosen by whole documents."""
    import numpy as np

    uniq = np.unique(docs)
    rng = np.random.default_rng(seed)
    n_test = max(1, int(round(len(uniq) * fraction)))
    test_docs = rng.choice(uniq, size=n_test, replace=False)
    return np.isin(docs, test_docs)


def bootstrap_group_means(sums, counts, n_boot: int = 200, seed: int = 0, level: float = 0.95):
    """Percentile interval of a ratio-of-sums mean with whole groups resampled.

    ``sums`` and ``counts``: (..., group) per-group totals and token counts; each resample draws the
    groups with replacement and takes Σ sums / Σ counts. Returns (low, high) of shape (...)."""
    import numpy as np

    sums, counts = np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    G = sums.shape[-1]
    w = np.random.default_rng(seed).multinomial(G, np.full(G, 1.0 / G), size=n_boot).T  # (group, boot)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (sums @ w) / (counts @ w)  # (..., boot)
    a = (1 - level) / 2
    return np.nanquantile(means, a, axis=-1), np.nanquantile(means, 1 - a, axis=-1)
