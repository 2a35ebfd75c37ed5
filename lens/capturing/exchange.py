"""``lens store export`` and ``lens store import`` as functions: the store in the field's formats, and hidden
states captured elsewhere as checked stores (the formats themselves: :mod:`lens.store.exchange`).

An import is verified against its model when the model loads: the source's first windows are run through the
plain Hugging Face forward and compared (:mod:`lens.capturing.import_check`); a source that does not match — a
one-layer shift, another model — is refused before anything is written. Without the model (``verify=False``,
or a safetensors export whose model does not load) the store's fidelity record says "not verified" (verdict
``not-checked``), which ``lens store info``, the studies' provenance and the explorer show.

TransformerLens hook names (a SAELens cache's column) come from :mod:`lens.capturing.backends.tl`, their one table.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from lens.capturing.backends.tl import TRANSFORMER_LENS_HOOKS, transformer_lens_hook
from lens.capturing.manifest import library_versions
from lens.capturing.import_check import check_import, not_verified, require_match
from lens.errors import LensInputError
from lens.model.loading import load_model
from lens.sites import HookSite, Site
from lens.store.exchange.importer import in_vocabulary, new_manifest, write_store
from lens.store.exchange.saelens import export_saelens, read_saelens
from lens.store.exchange.safetensors_io import export_pieces, export_safetensors, read_export
from lens.store.exchange.selection import require_on_disk
from lens.store.exchange.staging import check_target
from lens.store.exchange.vllm import read_vllm
from lens.store.exchange.zarr_io import export_zarr
from lens.store.fidelity import record_of, verdict_line
from lens.store.format import settings_fingerprint
from lens.store.manifest import Manifest
from lens.store.reader import open_store
from lens.text.corpora import token_strings

log = logging.getLogger(__name__)

EXPORT_FORMATS = ("safetensors", "saelens", "zarr")
IMPORT_FORMATS = ("safetensors", "saelens", "vllm")
SHARD_TOKENS = 16384  # tokens per shard of an imported store (as a capture's default)
PROBE = 2  # windows of an import run through the model (lens.capturing.fidelity.PROBE_WINDOWS)


def _format(name: str, allowed: tuple, verb: str) -> str:
    fmt = str(name).strip().lower()
    if fmt not in allowed:
        raise LensInputError(f"unknown {verb} format {name!r}: expected one of {', '.join(allowed)}")
    return fmt


def hook_name(site: str, layer) -> str:
    """The TransformerLens hook name of a site (a SAELens cache's column)."""
    return transformer_lens_hook(HookSite(Site(site), layer))


def site_of_hook(name: str, n_layers: int) -> tuple[str, int | None]:
    """(site, layer) of a TransformerLens hook name; refused when it names none of ours."""
    for site, pattern in TRANSFORMER_LENS_HOOKS.items():
        if site is Site.EMBED:
            continue
        for l in (range(n_layers) if "{l}" in pattern else [None]):
            if pattern.format(l=l) == name:
                return site.value, l
    raise LensInputError(f"the column {name!r} is not a TransformerLens hook of a site lens stores "
                         f"(blocks.L.hook_resid_post, ...) for a model of {n_layers} layers")


# --------------------------------------------------------------------------- export
def export_store(store, to: str, out, sites=None, layers=None, progress: bool = False) -> Path:
    """Export ``store`` (a folder or an open disk store) ``to`` safetensors, saelens or zarr into the new
    folder ``out``; returns it."""
    fmt = _format(to, EXPORT_FORMATS, "export")
    if not hasattr(store, "manifest"):
        store = open_store(store)
    require_on_disk(store)
    if not store.complete:
        raise LensInputError(f"store {store.root} is incomplete ({store.n_tokens} tokens): finish it with "
                             "`lens capture ... --resume` before exporting it")
    if fmt == "safetensors":
        return export_safetensors(store, out, sites, layers, progress)
    if fmt == "zarr":
        return export_zarr(store, out, sites, layers, progress)
    return export_saelens(store, out, sites, layers, hook_name, progress)


# --------------------------------------------------------------------------- import
def _load(model):
    return model if hasattr(model, "card") else load_model(model)


def _library_versions() -> dict:
    return library_versions()


def _check(model, probes, sites, dtype, backend, source, verify, layer_ids: bool = False):
    if not verify:
        return not_verified("imported with --no-verify (the states were not compared with the model)", backend, dtype,
                            model)
    if not probes:
        return not_verified("the source keeps no whole window to run through the model", backend, dtype, model)
    card = model.card().to_dict()
    for ids, _ in probes:  # before the forward, which would fail on them
        in_vocabulary(ids, card, source)
    record = check_import(model, probes, sites, dtype, backend)
    return require_match(record, model.model_id, source, layer_ids)


def import_store(src, fmt: str, out, model=None, layers=None, verify: bool = True, progress: bool = False,
                 shard_tokens: int = SHARD_TOKENS) -> Path:
    """Import ``src`` (``fmt``: vllm, saelens or safetensors) as the new store ``out``, verified against
    ``model`` (an alias, Hugging Face id or loaded model); ``layers``: the layer ids of a vLLM file's
    hidden states. Returns the store's path."""
    fmt = _format(fmt, IMPORT_FORMATS, "import")
    out = Path(out)
    check_target(out, "import")
    if fmt == "safetensors":
        return _import_export(src, out, model, verify, progress)
    if model is None:
        raise LensInputError(f"an import from {fmt} needs --model (the model the states come from: its tokenizer "
                             "gives the token texts, its forward verifies the states)")
    loaded = _load(model)
    card = loaded.card().to_dict()
    if fmt == "vllm":
        source = read_vllm(src, layers, card)
    else:
        source = read_saelens(src, card, lambda name: site_of_hook(name, int(card["n_layers"])))
    backend = f"imported from {fmt}"
    record = _check(loaded, source.probes(), source.sites, source.dtype, backend, str(src), verify, fmt == "vllm")
    manifest = new_manifest(card, source.sites, source.dtype, source.n_tokens, source.n_windows,
                            source=source.record, fidelity=record.to_dict(), seq_len=source.seq_len,
                            library_versions=_library_versions())
    special = set(getattr(loaded.tokenizer, "all_special_ids", []) or [])
    return write_store(out, manifest, source.pieces(shard_tokens, special),
                       text_of=lambda ids: token_strings(loaded.tokenizer, ids), progress=progress)


def _import_export(src, out: Path, model, verify: bool, progress: bool) -> Path:
    """Our own safetensors export back as a store: the same shards, token table and values."""
    source, files = read_export(src)
    head = json.loads(files[0].meta["lens_manifest"])  # the exported store's manifest (JSON)
    sites = {s: list(l) for s, l in source["sites"].items()}
    settings = dict(head.get("settings", {}))
    if sites != head["sites"]:
        settings["sites"] = [s if l is None else f"{s}.{l}" for s, ls in sites.items() for l in ls]
    # the new store's first manifest: the export's, with its own shards, sites and provenance
    first = Manifest.from_dict({**head, "shards": []}, validate=False).with_(  # an export lists no shards
        sites=sites, n_tokens=0, complete=False, n_tokens_planned=int(source["n_tokens"]),
        nonfinite={s: [0] * len(l) for s, l in sites.items()},
        imported={"from": "safetensors", "path": str(Path(src).resolve()), "files": len(files),
                  "source_store": source["path"], "source_manifest_sha256": source["manifest_sha256"],
                  "source_fidelity": verdict_line(record_of(head))})
    if sites != head["sites"]:
        first = first.with_(settings=settings, fingerprint=settings_fingerprint(settings))
    backend = "imported from safetensors"
    loaded, why = None, ""
    if model is not None and verify:
        try:
            loaded = _load(model)
        except (LensInputError, OSError) as exc:  # the export carries its model card and texts: import it unverified
            loaded, why = None, f"the model {model} could not be loaded ({' '.join(str(exc).split())[:200]})"
            log.warning("%s: importing %s without the fidelity check", why, src)
        if loaded is not None and loaded.model_id != head["model"]["model_id"] and loaded.card().to_dict() != head["model"]:
            log.warning("the export was captured from %s; checking it against %s", head["model"]["model_id"],
                        loaded.model_id)
    elif model is None:
        why = "no --model was given to compare the export with"
    else:
        why = "imported with --no-verify (the states were not compared with the model)"
    pieces = list(export_pieces(files, first))
    if loaded is None:
        record = not_verified(f"{why}; the source store's own check: {verdict_line(record_of(head))}", backend,
                              first.dtype)
    else:
        probes = []
        if (first.positions or "all") == "all" and pieces:
            tokens = pieces[0].tokens()  # a whole shard: whole windows
            sels = [np.flatnonzero(tokens["window"] == w) for w in list(dict.fromkeys(tokens["window"].tolist()))[:PROBE]]
            rows: dict = {}
            for _, blocks in pieces[0].chunks():  # only the probe windows' rows are kept
                for key, a in blocks.items():
                    rows[key] = [a[sel] for sel in sels]
            probes = [(tokens["token_id"][sel], {s: np.stack([rows[(s, i)][j] for i in range(len(ls))])
                                                 for s, ls in sites.items()}) for j, sel in enumerate(sels)]
        record = _check(loaded, probes, sites, first.dtype, backend, str(src), verify)
    first = first.with_(fidelity=record.to_dict()).checked("the imported store's manifest")
    return write_store(out, first, pieces, progress=progress)


__all__ = ["export_store", "import_store", "EXPORT_FORMATS", "IMPORT_FORMATS", "hook_name", "site_of_hook"]
