"""What a store records of its capture: the resolved settings resuming compares (``_settings``),
the sites' layout, library versions, and the manifest a new capture begins with (:func:`new_manifest`)."""

from __future__ import annotations

import importlib.metadata as md
import time

import numpy as np

from lens.capturing.spec import CaptureSpec
from lens.model.loaded import LoadedModel
from lens.model.loading import attn_implementation, model_dtype_name
from lens.sites import HookSite, Site
from lens.store.format import DTYPES, FORMAT, FORMAT_VERSION, settings_fingerprint
from lens.store.manifest import Manifest
from lens.store.parts import part_record
from lens.store.positions import positions_label


def library_versions() -> dict:
    out = {}
    for pkg in ("lens-workbench", "torch", "transformers", "numpy", "transformer-lens", "nnsight"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def _settings(model: LoadedModel, spec: CaptureSpec, hooks) -> dict:
    """What the manifest records of a capture (and resuming checks): ``spec`` resolved by :func:`capture`."""
    return {
        "model_id": model.model_id,
        "revision": model.revision,
        "corpus": spec.corpus.name,
        "corpus_fingerprint": spec.corpus.fingerprint,
        "transform": None if spec.transform is None else spec.transform.describe(),
        "seq_len": spec.seq_len,
        "max_tokens": spec.max_tokens,
        "batch_size": spec.batch_size,
        "dtype": spec.dtype,  # the stored arrays' dtype
        "model_dtype": model_dtype_name(model),  # the weights' and forward pass' dtype
        "attn": attn_implementation(model),
        "sites": [h.key for h in hooks],
        "backend": spec.backend,
        "shard_windows": spec.shard_windows,
    }


def _site_layout(hooks: list[HookSite]) -> tuple[dict, dict]:
    """site -> list of layers (None for single sites) and hook key -> (site, index in that list)."""
    sites: dict = {}
    index: dict = {}
    for h in hooks:
        layers = sites.setdefault(h.site.value, [])
        index[h.key] = (h.site.value, len(layers))
        layers.append(h.layer)
    return sites, index


def _widths(model: LoadedModel, site_layers: dict) -> dict:
    """Sites whose width is not d_model: MoE router logits have one column per expert."""
    return {Site.ROUTER_LOGITS.value: model.site_map.n_experts} if Site.ROUTER_LOGITS.value in site_layers else {}


def new_manifest(model: LoadedModel, spec: CaptureSpec, settings: dict, site_layers: dict, win, offsets: np.ndarray,
                 w_start: int, w_end: int, part, fidelity: dict | None) -> Manifest:
    """The manifest a new capture of windows ``[w_start, w_end)`` of ``win`` begins with (no shard yet), checked
    once (:meth:`Manifest.first`); the writer derives the next ones from it."""
    corpus, dtype, positions = spec.corpus, spec.dtype, spec.positions
    return Manifest.first({
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "model": model.card().to_dict(), "corpus": {"name": corpus.name, "source": corpus.source,
                                          "fingerprint": corpus.fingerprint,
                                          "transform": settings["transform"]},
        "settings": settings, "fingerprint": settings_fingerprint(settings),
        "sites": site_layers, "d_model": model.d_model, "widths": _widths(model, site_layers), "dtype": dtype,
        "storage_dtype": DTYPES[dtype][2], "positions": positions_label(positions),
        "sample": spec.sample, **({"sample_seed": spec.sample_seed} if spec.sample != "first" else {}), "n_tokens": 0,
        "nonfinite": {site: [0] * len(layers) for site, layers in site_layers.items()},
        "n_tokens_planned": int(offsets[w_end] - offsets[w_start]), "n_windows_planned": w_end - w_start,
        "shards": [], "complete": False, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "library_versions": library_versions(), "fidelity": fidelity,
        **({} if part is None else {"part": part_record(part, w_start, w_end, win.n_windows, win.n_tokens)}),
    })
