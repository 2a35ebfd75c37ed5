"""A store's manifest as a value: parsed and validated once, then read by attribute (issue #41).

As zarr's array metadata (``ArrayV3Metadata.from_dict`` / ``to_dict``): :meth:`Manifest.from_dict` checks a
manifest against the schema (:mod:`lens.store.schema`, the same one-line ``StoreCorruptError`` naming the
file and the field) and builds a frozen :class:`Manifest` with typed parts — the sites as
``{Site: (layer, ...)}``, the shards as :class:`ShardEntry` values, a split capture's part as a
:class:`PartRecord`, the model's card (:attr:`Manifest.card`),
the fidelity record (:attr:`Manifest.fidelity_record`). :meth:`Manifest.to_dict` gives the JSON object back,
key for key in the order it was read, so ``json.dumps(Manifest.from_dict(d).to_dict()) == json.dumps(d)``;
fields this version does not know (an imported store's ``source``) are kept in ``extra`` and written back.

Nested JSON the code does not interpret (the settings, the corpus, a shard's file records) is held frozen:
objects as :class:`FrozenDict` and arrays as :class:`FrozenList` (a ``dict`` / ``list`` that refuses every
change, so ``json.dumps`` and the parsers that want a dict or a list still take it).

Writing. A writer holds a value too and derives the next one: :meth:`Manifest.first` builds a new store's first
manifest (no shard yet) from its JSON object, checked once by the schema's rules; :meth:`Manifest.with_shard` adds
a finished shard (a :class:`ShardEntry` built whole: its tokens and non-finite counts summed in),
:meth:`Manifest.with_` / :meth:`Manifest.without` change or drop fields (as ``dataclasses.replace``) and
:meth:`Manifest.sealed` sets the checksum; :func:`lens.store.format.write_manifest` commits one, written with
:meth:`Manifest.to_dict` (:class:`lens.store.writer.ShardWriter` does all this for the capture, the merge and the
imports).

The JSON view. ``manifest["shards"]``, ``manifest.get("widths")``, ``"part" in manifest``: a manifest also
reads as a read-only mapping of its JSON object (frozen, as above), so that notebooks and the format-level
helpers written against the manifest's dict (``site_width``, the exchange formats of :mod:`lens.store.exchange`)
keep working; new code reads attributes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Iterator

from lens.errors import LensInputError
from lens.runtime.frozen_json import FrozenDict, FrozenList, freeze, ordered as _ordered, thaw  # noqa: F401
from lens.model.card import ModelCard
from lens.sites import Site
from lens.store.fidelity import FidelityRecord, record_of
from lens.store.schema import CHECKSUM_KEY, validate_manifest


def _site_map(d: Mapping) -> FrozenDict:
    """``{"resid_post": [..]}`` -> ``{Site.RESID_POST: (..)}`` (keys as :class:`Site`, lists as tuples)."""
    return FrozenDict((Site(k), tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in d.items())


def _site_json(d: Mapping) -> dict:
    return {Site.parse(k).value: thaw(v) for k, v in d.items()}


def manifest_digest(manifest: Mapping) -> str:
    """SHA-256 of the manifest's canonical JSON (sorted keys, no whitespace), its own checksum left out.

    Hashing the parsed content rather than the bytes makes re-indenting harmless and every change of
    meaning (a layer list reversed, a shard entry dropped) a mismatch."""
    body = {k: v for k, v in manifest.items() if k != CHECKSUM_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class ShardEntry:
    """One shard of a store: its folder name, tokens, windows ``[window_start, window_end)``, the checksummed
    files (file name -> frozen record), the statistics files (or None) and the non-finite counts per site
    and layer (None in format 1)."""

    name: str
    n_tokens: int
    window_start: int
    window_end: int
    files: Mapping[str, Any]
    stats: Mapping[str, Any] | None = None
    nonfinite: Mapping[Site, tuple[int, ...]] | None = None
    extra: Mapping[str, Any] = field(default_factory=FrozenDict)
    key_order: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping) -> "ShardEntry":
        if isinstance(d, ShardEntry):
            return d
        known = {"name", "n_tokens", "window_start", "window_end", "files", "stats", "nonfinite"}
        return cls(name=d["name"], n_tokens=int(d["n_tokens"]), window_start=int(d["window_start"]),
                   window_end=int(d["window_end"]), files=freeze(d["files"]),
                   stats=None if d.get("stats") is None else freeze(d["stats"]),
                   nonfinite=None if d.get("nonfinite") is None else _site_map(d["nonfinite"]),
                   extra=FrozenDict((k, freeze(v)) for k, v in d.items() if k not in known), key_order=tuple(d))

    @classmethod
    def build(cls, name: str, n_tokens: int, window_start: int, window_end: int, files: Mapping[str, Any],
              stats: Mapping[str, Any] | None, nonfinite: Mapping) -> "ShardEntry":
        """The entry of a shard a writer has just finished (its files' records as the writer made them)."""
        return cls(name=name, n_tokens=int(n_tokens), window_start=int(window_start), window_end=int(window_end),
                   files=freeze(dict(files)), stats=None if stats is None else freeze(dict(stats)),
                   nonfinite=_site_map(nonfinite))

    def to_dict(self) -> dict:
        out: dict = {"name": self.name, "n_tokens": self.n_tokens, "window_start": self.window_start,
                     "window_end": self.window_end, "files": thaw(self.files)}
        if self.nonfinite is not None:
            out["nonfinite"] = _site_json(self.nonfinite)
        if self.stats is not None:
            out["stats"] = thaw(self.stats)
        out.update((k, thaw(v)) for k, v in self.extra.items())
        return _ordered(out, self.key_order or ("name", "n_tokens", "window_start", "window_end", "nonfinite", "files"))

    def file(self, fname: str) -> Mapping[str, Any]:
        """The record (bytes, checksums) of one of the shard's files."""
        return self.files[fname]

    def has_stats(self, site: "Site | str") -> bool:
        return self.stats is not None and f"stats.{Site.parse(site).value}.npy" in self.stats


@dataclass(frozen=True)
class PartRecord:
    """One part of a split capture (``--part i/N``; written by :func:`lens.store.parts.part_record`): part
    ``index`` of ``count``, the windows ``[window_start, window_end)`` of the whole plan it captures, and the whole
    plan's ``n_windows_total`` / ``n_tokens_total`` (what the merged store will hold)."""

    index: int
    count: int
    window_start: int
    window_end: int
    n_windows_total: int
    n_tokens_total: int
    extra: Mapping[str, Any] = field(default_factory=FrozenDict)
    key_order: tuple[str, ...] = field(default=(), repr=False, compare=False)

    _FIELDS = ("index", "count", "window_start", "window_end", "n_windows_total", "n_tokens_total")

    @classmethod
    def from_dict(cls, d: Mapping) -> "PartRecord":
        if isinstance(d, PartRecord):
            return d
        return cls(**{k: int(d[k]) for k in cls._FIELDS},
                   extra=FrozenDict((k, freeze(v)) for k, v in d.items() if k not in cls._FIELDS), key_order=tuple(d))

    def to_dict(self) -> dict:
        out: dict = {k: getattr(self, k) for k in self._FIELDS}
        out.update((k, thaw(v)) for k, v in self.extra.items())
        return _ordered(out, self.key_order or self._FIELDS)

    @property
    def label(self) -> str:
        """``i/N``, as ``--part`` takes it."""
        return f"{self.index}/{self.count}"


# the manifest's known fields in the order a capture writes them; (JSON key, attribute) where they differ
_OPTIONAL = ("corpus", "settings", "fingerprint", "positions", "sample", "sample_seed", "nonfinite",
             "n_tokens_planned", "n_windows_planned", "created", "library_versions", "fidelity", "part",
             "merged_from", "imported")
_ORDER = ("format", "format_version", "model", "corpus", "settings", "fingerprint", "sites", "d_model", "widths",
          "dtype", "storage_dtype", "positions", "sample", "sample_seed", "n_tokens", "nonfinite", "n_tokens_planned",
          "n_windows_planned", "shards", "complete", "created", "library_versions", "fidelity", "part", "merged_from",
          "imported", CHECKSUM_KEY)
_ABSENT: Any = object()  # a field the JSON does not hold (kept apart from a field written as null)


@dataclass(frozen=True)
class Manifest:
    """A store's ``manifest.json`` (see the module docstring). Optional fields a store does not record are
    ``None`` (and are not written back); ``widths`` is empty where every site is ``d_model`` wide."""

    format: str
    format_version: int
    model: Mapping[str, Any]  # the model card's JSON (typed: :attr:`card`)
    sites: Mapping[Site, tuple[int | None, ...]]
    d_model: int
    dtype: str
    storage_dtype: str
    n_tokens: int
    shards: tuple[ShardEntry, ...]
    complete: bool
    widths: Mapping[Site, int] = field(default_factory=FrozenDict)
    corpus: Mapping[str, Any] | None = None
    settings: Mapping[str, Any] | None = None
    fingerprint: str | None = None
    positions: str | None = None
    sample: str | None = None
    sample_seed: int | None = None
    nonfinite: Mapping[Site, tuple[int, ...]] | None = None
    n_tokens_planned: int | None = None
    n_windows_planned: int | None = None
    created: str | None = None
    library_versions: Mapping[str, str] | None = None
    fidelity: Mapping[str, Any] | None = None  # the fidelity record's JSON (typed: :attr:`fidelity_record`)
    part: PartRecord | None = None  # one part of a split capture
    merged_from: tuple[Mapping[str, Any], ...] | None = None  # a merged store's parts (lens.store.parts)
    imported: Mapping[str, Any] | None = None  # where an imported store came from (lens.store.exchange.importer)
    checksum: str | None = None  # manifest_sha256 (format 2)
    extra: Mapping[str, Any] = field(default_factory=FrozenDict)  # fields this version does not know
    key_order: tuple[str, ...] = field(default=(), repr=False, compare=False)  # the JSON's key order
    absent: frozenset[str] = field(default=frozenset(), repr=False, compare=False)  # optional keys not in the JSON

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_dict(cls, d: Mapping, where: str = "manifest.json", *, validate: bool = True) -> "Manifest":
        """The manifest the JSON object ``d`` describes, checked against the schema first (``validate``;
        ``StoreCorruptError("<where>: <problem>")``); ``validate=False`` is for JSON the caller built itself (not yet
        sealed: :meth:`first` checks it once with :meth:`checked`) or has checked already."""
        if isinstance(d, Manifest):
            return d
        if validate:
            validate_manifest(d if isinstance(d, dict) else thaw(d), where)
        get = d.get
        known = set(_ORDER) | {"widths"}
        optional = {k: (freeze(d[k]) if k in d else None) for k in _OPTIONAL}
        for k in ("nonfinite",):
            if optional[k] is not None:
                optional[k] = _site_map(d[k])
        if optional["part"] is not None:
            optional["part"] = PartRecord.from_dict(d["part"])
        return cls(format=d["format"], format_version=d["format_version"], model=freeze(d["model"]),
                   sites=_site_map(d["sites"]), d_model=int(d["d_model"]), dtype=d["dtype"],
                   storage_dtype=d["storage_dtype"], n_tokens=int(d["n_tokens"]),
                   shards=tuple(ShardEntry.from_dict(s) for s in d["shards"]), complete=bool(d["complete"]),
                   widths=_site_map(get("widths") or {}), checksum=get(CHECKSUM_KEY), **optional,
                   extra=FrozenDict((k, freeze(v)) for k, v in d.items() if k not in known), key_order=tuple(d),
                   absent=frozenset(k for k in (*_OPTIONAL, "widths", CHECKSUM_KEY) if k not in d))

    def to_dict(self) -> dict:
        """The JSON object of this manifest (a fresh, mutable dict: a writer's draft), key for key as read."""
        values = {"format": self.format, "format_version": self.format_version, "model": thaw(self.model),
                  "sites": _site_json(self.sites), "d_model": self.d_model, "dtype": self.dtype,
                  "storage_dtype": self.storage_dtype, "n_tokens": self.n_tokens,
                  "shards": [s.to_dict() for s in self.shards], "complete": self.complete}
        if "widths" not in self.absent:
            values["widths"] = _site_json(self.widths)
        for k in _OPTIONAL:
            value = getattr(self, k)
            if k in self.absent or (value is None and not self.key_order):
                continue
            values[k] = (_site_json(value) if k == "nonfinite" and value is not None else
                         value.to_dict() if isinstance(value, PartRecord) else thaw(value))
        if self.checksum is not None or (self.key_order and CHECKSUM_KEY not in self.absent):
            values[CHECKSUM_KEY] = self.checksum
        values.update((k, thaw(v)) for k, v in self.extra.items())
        return _ordered(values, self.key_order or _ORDER)

    # ------------------------------------------------------------------ deriving (writers; see the module docstring)
    @classmethod
    def first(cls, d: Mapping, where: str = "the new manifest") -> "Manifest":
        """A new store's first manifest (no shard yet, not sealed) from its JSON object ``d``, checked once by the
        schema's rules as it will be committed (sealed); a writer's mistake is ``StoreCorruptError("<where>: ...")``.
        The value writes ``d``'s keys in ``d``'s order."""
        return cls.from_dict(thaw(d), where, validate=False).checked(where)

    def checked(self, where: str = "the new manifest") -> "Manifest":
        """This manifest, once the schema's rules hold for it as it will be committed (sealed): a writer's check
        of a manifest it derived (:meth:`first`, a merge's); ``StoreCorruptError("<where>: ...")`` otherwise."""
        validate_manifest({**self.to_dict(), CHECKSUM_KEY: "0" * 64}, where)  # any checksum: sealed when committed
        return self

    def with_(self, **changes: Any) -> "Manifest":
        """This manifest with ``changes`` (as :func:`dataclasses.replace`): JSON given as dicts and lists is frozen,
        site maps keyed by :class:`Site`, shards taken as :class:`ShardEntry`; a field given is written (also one
        the JSON did not hold), after the fields read if it is new."""
        for k, v in changes.items():
            if k in ("sites", "widths", "nonfinite") and v is not None:
                changes[k] = _site_map(v)
            elif k == "shards":
                changes[k] = tuple(ShardEntry.from_dict(s) for s in v)
            elif k == "part":
                changes[k] = None if v is None else PartRecord.from_dict(v)
            elif k in ("model", "corpus", "settings", "library_versions", "fidelity", "merged_from", "imported",
                       "extra"):
                changes[k] = None if v is None else freeze(v)
        given = {CHECKSUM_KEY if k == "checksum" else k for k in changes}
        return replace(self, **changes, absent=self.absent - given)

    def without(self, *names: str) -> "Manifest":
        """This manifest without the optional fields ``names`` (not written, as if the JSON never held them: given
        again, one comes after the fields read)."""
        keys = {CHECKSUM_KEY if k == "checksum" else k for k in names}
        if not keys <= {*_OPTIONAL, "widths", CHECKSUM_KEY}:
            raise ValueError(f"not optional manifest fields: {sorted(keys - {*_OPTIONAL, 'widths', CHECKSUM_KEY})}")
        cleared: dict = {("checksum" if k == CHECKSUM_KEY else k): (FrozenDict() if k == "widths" else None)
                         for k in keys}
        return replace(self, **cleared, absent=self.absent | keys,
                       key_order=tuple(k for k in self.key_order if k not in keys))

    def with_shard(self, entry: ShardEntry) -> "Manifest":
        """This manifest with the finished shard ``entry`` listed last: ``n_tokens`` the shards' sum, ``nonfinite``
        the store's counts plus the shard's (not sealed: :meth:`sealed`)."""
        shards = (*self.shards, entry)
        before = self.nonfinite if self.nonfinite is not None else {s: (0,) * len(l) for s, l in self.sites.items()}
        added = entry.nonfinite or {}
        nonfinite = {s: tuple(int(a) + int(b) for a, b in zip(counts, added.get(s, (0,) * len(counts))))
                     for s, counts in before.items()}
        return self.with_(shards=shards, n_tokens=sum(s.n_tokens for s in shards), nonfinite=nonfinite)

    def sealed(self, format_version: int) -> "Manifest":
        """This manifest as committed: ``format_version`` set and ``manifest_sha256`` the digest of the rest."""
        body = self.with_(format_version=format_version)
        return body.with_(checksum=manifest_digest(body.to_dict()))

    # ------------------------------------------------------------------ the JSON view (see the module docstring)
    @cached_property
    def _json(self) -> FrozenDict:
        return freeze(self.to_dict())

    def __getitem__(self, key: str) -> Any:
        return self._json[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._json.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._json

    def __iter__(self) -> Iterator[str]:
        return iter(self._json)

    def __len__(self) -> int:
        return len(self._json)

    def keys(self):
        return self._json.keys()

    def items(self):
        return self._json.items()

    # ------------------------------------------------------------------ derived
    @property
    def model_id(self) -> str:
        return str(self.model["model_id"])

    @property
    def n_layers(self) -> int:
        return int(self.model["n_layers"])

    @cached_property
    def card(self) -> ModelCard:
        """The typed model card (:class:`lens.model.card.ModelCard`)."""
        return ModelCard.from_dict(thaw(self.model))

    @cached_property
    def fidelity_record(self) -> FidelityRecord | None:
        """The capture's fidelity record (:class:`lens.store.fidelity.FidelityRecord`), None when not recorded."""
        return record_of({"fidelity": thaw(self.fidelity)} if self.fidelity is not None else {})

    @property
    def site_list(self) -> tuple[Site, ...]:
        return tuple(self.sites)

    def site(self, site: "Site | str") -> Site:
        """``site`` as a :class:`Site` of this store; a name it does not hold: one line listing its sites."""
        try:
            parsed = Site.parse(site)
        except (ValueError, LensInputError):
            parsed = None
        if parsed is None or parsed not in self.sites:
            raise LensInputError(f"site {str(site)!r} is not in this store (it has "
                                 f"{', '.join(s.value for s in self.sites)})")
        return parsed

    def layers_of(self, site: "Site | str") -> tuple[int | None, ...]:
        """The stored layers of ``site`` (``(None,)`` for a single-position site)."""
        return self.sites[self.site(site)]

    def width(self, site: "Site | str") -> int:
        """Columns of a site's states: ``d_model``, except sites listed in ``widths``."""
        return int(self.widths.get(Site.parse(site), self.d_model))

    def has_stats(self, site: "Site | str") -> bool:
        """Whether every shard records the statistics of ``site``."""
        return bool(self.shards) and all(s.has_stats(site) for s in self.shards)

    def nonfinite_of(self, site: "Site | str") -> tuple[int, ...] | None:
        return None if self.nonfinite is None else self.nonfinite.get(Site.parse(site))
