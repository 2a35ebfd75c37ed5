"""The manifest's schema: every field a reader relies on, its type, and how the fields agree.

A manifest is refused (``StoreCorruptError`` naming the file and the field) unless, among others:
sites are known site names with strictly increasing layers inside the model; shard names are the
sequence ``00000, 00001, ...`` (so no name can point outside ``shards/``); the shards' windows are
contiguous (from window 0, or from ``part.window_start`` in one part of a split capture); their token counts add up to ``n_tokens``; each shard lists exactly the files the sites
and the token table need, with checksums of the right form; and an activation file's recorded size is
exactly its header plus ``layers x tokens x width`` values (width: d_model, or the site's entry in
``widths``). Runs before the checksum check, so a damaged manifest is described by what is wrong with
it, not only by "checksum mismatch".
"""

from __future__ import annotations

import re

import numpy as np
import torch

from lens.errors import StoreCorruptError
from lens.sites import Site
from lens.store.fidelity import check_record
from lens.store.positions import parse_positions
from lens.text.windows import SAMPLES

# the names a manifest is written in (lens.store.format writes and reads them; they are here so that the schema,
# which checks them, needs nothing from the format)
CHECKSUM_KEY = "manifest_sha256"
TOKEN_COLUMNS = ("doc", "window", "pos", "doc_pos", "token_id", "next_token_id", "special", "token")
DTYPES = {  # the store dtype -> (torch dtype, numpy storage dtype, manifest "storage_dtype")
    "float32": (torch.float32, np.float32, "float32"),
    "float16": (torch.float16, np.float16, "float16"),
    "bfloat16": (torch.bfloat16, np.uint16, "bfloat16-as-uint16"),
}


def storage_np_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of the stored arrays, little-endian whatever the machine (it is in every header)."""
    return np.dtype(DTYPES[dtype][1]).newbyteorder("<")

HEX8 = re.compile(r"[0-9a-f]{8}")
HEX64 = re.compile(r"[0-9a-f]{64}")


class _Bad(Exception):
    pass


def _int(value, what: str, lo: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Bad(f"{what} must be an integer, found {_show(value)}")
    if value < lo:
        raise _Bad(f"{what} must be at least {lo}, found {value}")
    return value


def _hex(value, what: str, pattern=HEX8) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise _Bad(f"{what} must be a hex checksum, found {_show(value)}")
    return value


def _dict(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise _Bad(f"{what} must be an object, found {_show(value)}")
    return value


def _list(value, what: str) -> list:
    if not isinstance(value, list):
        raise _Bad(f"{what} must be a list, found {_show(value)}")
    return value


def _show(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def _need(m: dict, key: str, what: str = ""):
    if key not in m:
        raise _Bad(f"field {what}{key!r} is missing")
    return m[key]


def expected_files(sites: dict) -> set[str]:
    return {f"{s}.npy" for s in sites} | {f"tokens.{c}.npy" for c in TOKEN_COLUMNS}


def validate_manifest(m: dict, path) -> None:
    """Raise ``StoreCorruptError("<path>: <problem>")`` unless ``m`` is a consistent manifest."""
    try:
        _validate(m)
    except _Bad as exc:
        raise StoreCorruptError(f"{path}: {exc}") from None


def _check_model(m: dict) -> tuple[int, int, str]:
    """(n_layers, d_model, dtype) of the manifest's model and dtype fields."""
    model = _dict(_need(m, "model"), "model")
    if not isinstance(model.get("model_id"), str):
        raise _Bad(f"model.model_id must be a string, found {_show(model.get('model_id'))}")
    n_layers = _int(_need(model, "n_layers", "model."), "model.n_layers", 1)
    d_model = _int(_need(m, "d_model"), "d_model", 1)
    dtype = _need(m, "dtype")
    if dtype not in DTYPES:
        raise _Bad(f"dtype must be one of {', '.join(DTYPES)}, found {_show(dtype)}")
    if m.get("storage_dtype") != DTYPES[dtype][2]:
        raise _Bad(f"storage_dtype {m.get('storage_dtype')!r} does not go with dtype {dtype!r} "
                   f"(expected {DTYPES[dtype][2]!r})")
    return n_layers, d_model, dtype


def _check_sites(m: dict, n_layers: int) -> tuple[dict, dict]:
    """(sites, widths): known site names, each with strictly increasing layers inside the model."""
    sites = _dict(_need(m, "sites"), "sites")
    if not sites:
        raise _Bad("sites is empty")
    for name, layers in sites.items():
        try:
            site = Site(name)
        except ValueError:
            raise _Bad(f"unknown site {name!r} in sites") from None
        _list(layers, f"sites.{name}")
        if not site.per_layer:
            if layers != [None]:
                raise _Bad(f"sites.{name} must be [null] (a single-position site), found {_show(layers)}")
            continue
        if not layers:
            raise _Bad(f"sites.{name} lists no layers")
        for l in layers:
            _int(l, f"a layer of sites.{name}")
        if any(b <= a for a, b in zip(layers, layers[1:])):
            raise _Bad(f"sites.{name} layers must be strictly increasing, found {layers}")
        if layers[0] < 0 or layers[-1] >= n_layers:
            raise _Bad(f"sites.{name} layers must lie in 0..{n_layers - 1}, found {layers}")
    widths = _dict(m.get("widths", {}), "widths")
    for name, w in widths.items():
        if name not in sites:
            raise _Bad(f"widths names {name!r}, which is not in sites")
        _int(w, f"widths.{name}", 1)
    return sites, widths


def _check_part(m: dict) -> tuple[int, int | None]:
    """(the first window, the window after the last) of one part of a split capture (lens.store.parts): its
    shards start inside the plan; (0, None) for a whole capture."""
    if "part" not in m:
        return 0, None
    part = _dict(m["part"], "part")
    count = _int(_need(part, "count", "part."), "part.count", 1)
    index = _int(_need(part, "index", "part."), "part.index", 1)
    if index > count:
        raise _Bad(f"part.index {index} exceeds part.count {count}")
    window = _int(_need(part, "window_start", "part."), "part.window_start")
    window_end = _int(_need(part, "window_end", "part."), "part.window_end", window + 1)
    if window_end > _int(_need(part, "n_windows_total", "part."), "part.n_windows_total", 1):
        raise _Bad("part.window_end lies past part.n_windows_total")
    _int(_need(part, "n_tokens_total", "part."), "part.n_tokens_total", 1)
    return window, window_end


def _check_shard_files(where: str, files: dict, sites: dict, widths: dict, d_model: int, dtype: str, n: int,
                       version: int) -> None:
    """Each file of a shard: its checksums of the right form, an activation file's size its header plus
    ``layers x tokens x width`` values."""
    itemsize = storage_np_dtype(dtype).itemsize
    for fname, meta in files.items():
        fw = f"{where}.files[{fname!r}]"
        _dict(meta, fw)
        size = _int(_need(meta, "bytes", f"{fw}."), f"{fw}.bytes")
        if fname.startswith("tokens."):
            _hex(_need(meta, "crc32", f"{fw}."), f"{fw}.crc32")
            continue
        layers = sites[fname[:-len(".npy")]]
        crcs = _list(_need(meta, "layer_crc32", f"{fw}."), f"{fw}.layer_crc32")
        if len(crcs) != len(layers):
            raise _Bad(f"{fw}.layer_crc32 has {len(crcs)} entries for {len(layers)} layers")
        for c in crcs:
            _hex(c, f"{fw}.layer_crc32")
        if version >= 2:
            head = _int(_need(meta, "header_bytes", f"{fw}."), f"{fw}.header_bytes", 16)
            _hex(_need(meta, "header_crc32", f"{fw}."), f"{fw}.header_crc32")
            width = widths.get(fname[:-len(".npy")], d_model)
            want = head + len(layers) * n * width * itemsize
            if size != want:
                raise _Bad(f"{fw}.bytes is {size}, but {len(layers)} layers x {n} tokens x width {width} "
                           f"in {dtype} plus a {head}-byte header make {want}")
        else:
            _hex(_need(meta, "crc32", f"{fw}."), f"{fw}.crc32")


def _check_shard_sums(where: str, shard: dict, sites: dict, version: int, nonfinite_total: dict) -> None:
    """A shard's optional statistics files and (format 2) its non-finite counts, added to ``nonfinite_total``."""
    if "stats" in shard:  # optional: per-shard statistics (lens.store.stats), one file per site
        stats = _dict(shard["stats"], f"{where}.stats")
        if set(stats) != {f"stats.{s}.npy" for s in sites}:
            raise _Bad(f"{where}.stats must name one stats.SITE.npy per site, found {sorted(stats)}")
        for fname, meta in stats.items():
            fw = f"{where}.stats[{fname!r}]"
            _dict(meta, fw)
            _int(_need(meta, "bytes", f"{fw}."), f"{fw}.bytes")
            _hex(_need(meta, "crc32", f"{fw}."), f"{fw}.crc32")
    if version >= 2:
        counts = _dict(_need(shard, "nonfinite", f"{where}."), f"{where}.nonfinite")
        if set(counts) != set(sites):
            raise _Bad(f"{where}.nonfinite must have one entry per site")
        for site, row in counts.items():
            if len(_list(row, f"{where}.nonfinite.{site}")) != len(sites[site]):
                raise _Bad(f"{where}.nonfinite.{site} must have one count per layer")
            for j, c in enumerate(row):
                nonfinite_total[site][j] += _int(c, f"{where}.nonfinite.{site}")


def _check_fidelity(record) -> None:
    """The capture's fidelity record: every field of its type, judged by the documented tolerance
    (lens.store.fidelity.check_record: a record reading "ok" past it was altered after its capture)."""
    try:
        check_record(record)
    except ValueError as exc:
        raise _Bad(f"its fidelity record is malformed: {exc}") from None


def _check_sample(m: dict) -> None:
    """``sample`` / ``sample_seed`` (absent in stores from before they were recorded), at the top level and in
    ``settings``."""
    for where, d in (("", m), ("settings.", m.get("settings") or {})):
        if "sample" in d and d["sample"] not in SAMPLES:
            raise _Bad(f"{where}sample must be {' or '.join(SAMPLES)}, found {_show(d['sample'])}")
        if "sample_seed" in d:
            _int(d["sample_seed"], f"{where}sample_seed")


def _validate(m: dict) -> None:
    version = m["format_version"]  # checked by read_manifest
    n_layers, d_model, dtype = _check_model(m)
    sites, widths = _check_sites(m, n_layers)
    n_tokens = _int(_need(m, "n_tokens"), "n_tokens")
    if not isinstance(m.get("complete"), bool):
        raise _Bad(f"complete must be true or false, found {_show(m.get('complete'))}")
    if "n_tokens_planned" in m:
        _int(m["n_tokens_planned"], "n_tokens_planned")
    if "settings" in m:
        _dict(m["settings"], "settings")
    if m.get("fidelity") is not None:  # the capture's fidelity record (lens.store.fidelity); absent in older stores
        _check_fidelity(m["fidelity"])
    thinned = m.get("positions", "all") != "all"  # a capture keeping some positions of each window
    if thinned:
        try:
            parse_positions(m["positions"] if isinstance(m["positions"], str) else None)
        except ValueError:
            raise _Bad(f"positions must be all, last, every:K, first:K or integers, found {_show(m['positions'])}") from None
    _check_sample(m)
    if version >= 2:
        _hex(_need(m, CHECKSUM_KEY), CHECKSUM_KEY, HEX64)
    shards = _list(_need(m, "shards"), "shards")
    window, window_end = _check_part(m)
    files_wanted = expected_files(sites)
    total = 0
    nonfinite_total = {s: [0] * len(layers) for s, layers in sites.items()}
    for i, shard in enumerate(shards):
        where = f"shards[{i}]"
        _dict(shard, where)
        if shard.get("name") != f"{i:05d}":
            raise _Bad(f"{where}.name must be {i:05d} (shards are numbered in order), found {_show(shard.get('name'))}")
        # a thinned store's shard may keep no row (its windows are all shorter than the positions asked)
        n = _int(_need(shard, "n_tokens", f"{where}."), f"{where}.n_tokens", 0 if thinned else 1)
        start = _int(_need(shard, "window_start", f"{where}."), f"{where}.window_start")
        end = _int(_need(shard, "window_end", f"{where}."), f"{where}.window_end", 1)
        if start != window or end <= start:
            raise _Bad(f"{where} covers windows {start}..{end}, expected to start at {window} "
                       "(shards must be contiguous): a shard entry is missing, duplicated or out of order")
        window = end
        total += n
        files = _dict(_need(shard, "files", f"{where}."), f"{where}.files")
        if set(files) != files_wanted:
            missing, extra = sorted(files_wanted - set(files)), sorted(set(files) - files_wanted)
            raise _Bad(f"{where}.files does not match the sites and token columns "
                       f"(missing {missing or 'none'}, unexpected {extra or 'none'})")
        _check_shard_files(where, files, sites, widths, d_model, dtype, n, version)
        _check_shard_sums(where, shard, sites, version, nonfinite_total)
    if window_end is not None and m["complete"] and window != window_end:
        raise _Bad(f"the part is marked complete but its shards end at window {window}, not {window_end}")
    if total != n_tokens:
        raise _Bad(f"n_tokens is {n_tokens} but the shards hold {total}")
    if m["complete"] and "n_tokens_planned" in m and n_tokens != m["n_tokens_planned"]:
        raise _Bad(f"the store is marked complete with {n_tokens} of {m['n_tokens_planned']} planned tokens")
    if version >= 2 and _need(m, "nonfinite") != nonfinite_total:
        raise _Bad("nonfinite does not equal the sum of the shards' counts")
