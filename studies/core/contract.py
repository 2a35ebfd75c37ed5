"""The study contract: what a study declares, what the runner gives it and what it hands back.

A study is one module of ``studies/`` holding ``STUDY = Study(...)`` and one line in
:mod:`studies.core.registry`. It declares, as values the runner, the main job, the report and the
explorer read:

- ``config``: a frozen dataclass extending :class:`studies.core.config.StudyConfig`, every field defaulted;
- ``needs(config) -> Needs``: the store sites it reads, whether it needs the model (an LM head, a
  causal model), control stores under a corpus transform — the main job asks this, it never guesses;
- ``check(config)``: validation that needs nothing loaded (runs before any model or capture);
- ``result``: a :class:`ResultSpec` naming every metric, summary value and array with its axes. It is
  the one place a result name is spelled: the study writes ``M.pr``, the explorer reads ``M.pr``,
  and the runner refuses a result that uses an undeclared name;
- ``compute(config, inputs) -> StudyResult``: the numbers (no files, no figures);
- ``figures(result, config) -> {name: plotly Figure}``: drawn from the result alone ("main" first);
- ``headlines``: :class:`Headline` rows (a value read from a result record, beside a seed claim);
- ``claims``: :class:`Claim` rows — a seed paper's claim, the value that tests it (with its interval)
  and the one :class:`Rule` that judges it (agrees / weaker / contradicts / not applicable).

The names, labels, units, layer axis, headlines and claims of a study live in a module of plain data,
``studies.<study>.declaration`` (:func:`studies.core.registry.declaration`), which imports neither torch
nor the study's compute code: the explorer and the report read them from there.

:func:`studies.core.runner.run_study` composes them: prepare (load, capture or open, check the model card)
→ compute → figures → write the results folder. A faster implementation of a study replaces
``compute`` (or hands the runner a store on another device) and keeps everything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, runtime_checkable

import numpy as np

# the judged claims live in studies.core.claims; their names stay importable from here
from studies.core.axis import AxisKind, LayerAxis  # noqa: F401  (re-exported: the contract's names)
from studies.core.claims import (  # noqa: F401
    AGREES, CONTRADICTS, NOT_APPLICABLE, UNDECIDED, VERDICTS, WEAKER, Claim, Headline, Rule, _number,
)
from lens.sites import Site

if TYPE_CHECKING:  # names for annotations only: importing the contract loads no torch
    import torch
    from plotly.graph_objects import Figure
    from transformers import PreTrainedTokenizerBase

    from lens.model.card import BlockKind, NormKind
    from lens.store.views import LayerView
    from studies.core.config import StudyConfig
    from studies.reporting.results import ResultRecord


# ---------------------------------------------------------------------------- declared names
@dataclass(frozen=True)
class Field:
    """One declared result name. ``name`` holds ``{}`` for a family of names (``"nonlinearity__{}"``:
    one per token class); call the field to spell a member: ``M.nonlinearity("punctuation")``.
    ``axes``: ``("layer",)`` for a per-layer metric, ``()`` for a summary value, an array's axes."""

    name: str
    doc: str
    axes: tuple[str, ...] = ()
    attr: str = ""
    label: bool = False  # an array of ids or strings that describe tokens, not a measurement
    title: str = ""  # what a reader calls it, for legends, hovers, axes and tables ("{}" filled as in name)
    unit: str = ""  # its unit ("nats", "share of tokens (0–1)", "cosine", ...); "" for text values

    def heading(self, key: str | None = None) -> str:
        """The human label of ``key`` (a member of this name or family): the title with the family's
        parts filled in, else the key itself."""
        key = key or self.name
        if not self.title:
            return key
        if not self.is_family:
            return self.title
        parts = _family_parts(self.name, key)
        return self.title.format(*parts) if parts and self.title.count("{}") == len(parts) else self.title

    @property
    def is_family(self) -> bool:
        return "{}" in self.name

    def __call__(self, *parts) -> str:
        if not self.is_family:
            raise TypeError(f"{self.name!r} is one name, not a family of names")
        return self.name.format(*parts)

    def matches(self, key: str) -> bool:
        if not self.is_family:
            return key == self.name
        pattern = "".join(".+" if p == "{}" else re.escape(p) for p in re.split(r"(\{\})", self.name))
        return re.fullmatch(pattern, key) is not None


def _family_parts(name: str, key: str) -> tuple[str, ...] | None:
    pattern = "".join("(.+)" if p == "{}" else re.escape(p) for p in re.split(r"(\{\})", name))
    m = re.fullmatch(pattern, key)
    return m.groups() if m else None


def _attr(name: str, attr: str | None) -> str:
    attr = attr or name.replace("{}", "").strip("_")
    if not attr.isidentifier():
        raise ValueError(f"declared name {name!r} needs an attribute name (got {attr!r})")
    return attr


def metric(name: str, doc: str, attr: str | None = None, *, title: str = "", unit: str = "") -> Field:
    """A per-layer metric: one value per entry of the result's ``layers``; ``title`` / ``unit``: its
    human label and unit (every metric declares both: tests/studies/core/test_declarations.py)."""
    return Field(name, doc, ("layer",), _attr(name, attr), title=title, unit=unit)


def scalar(name: str, doc: str, attr: str | None = None, *, title: str = "", unit: str = "") -> Field:
    """A summary value (a number, a string or a small list)."""
    return Field(name, doc, (), _attr(name, attr), title=title, unit=unit)


def interval_scalars(name: str, doc: str, *, title: str, unit: str, how: str = "") -> tuple[Field, Field, Field]:
    """A judged summary value and its 95% interval, declared together: ``name``, ``name_low``, ``name_high``
    (``how``: how the interval is drawn, e.g. "whole documents resampled (windows when fewer than 10)")."""
    low_doc = f"95% interval of {name}" + (f", {how}" if how else "") + ", low"
    return (scalar(name, doc, title=title, unit=unit),
            scalar(f"{name}_low", low_doc, title=f"{title}, 95% interval low", unit=unit),
            scalar(f"{name}_high", f"95% interval of {name}, high", title=f"{title}, 95% interval high", unit=unit))


def array(name: str, axes: str, doc: str, attr: str | None = None, label: bool = False, *, title: str = "",
          unit: str = "") -> Field:
    """An array of ``arrays.npz``; ``axes``: space-separated axis names, e.g. ``"layer token"``;
    ``label``: it holds ids or strings (a token's top-1 id), not a measurement to colour text by."""
    return Field(name, doc, tuple(axes.split()), _attr(name, attr), label, title=title, unit=unit)


class Names:
    """The declared names of one section of a result, by attribute: ``M.pr == "pr"``; a family is
    returned as its :class:`Field` (call it to spell a member)."""

    def __init__(self, *fields: Field):
        self._fields: dict[str, Field] = {}
        for f in fields:
            if f.attr in self._fields:
                raise ValueError(f"{f.attr!r} is declared twice")
            self._fields[f.attr] = f

    def __getattr__(self, attr: str):
        fields = self.__dict__.get("_fields", {})
        if attr not in fields:
            raise AttributeError(f"no declared name {attr!r} (declared: {', '.join(fields)})")
        f = fields[attr]
        return f if f.is_family else f.name

    def __iter__(self):
        return iter(self._fields.values())

    def __len__(self) -> int:
        return len(self._fields)

    def field(self, key: str) -> Field | None:
        """The declaration ``key`` falls under (exact names before families), or None."""
        exact = next((f for f in self if not f.is_family and f.name == key), None)
        return exact or next((f for f in self if f.is_family and f.matches(key)), None)


@dataclass(frozen=True)
class ResultSpec:
    """Every name a study's result may hold. ``token_rows``: the array (axis ``token``) that maps
    the ``token`` axis of per-token arrays to store rows; ``token_text``: the array holding those
    tokens' text, when the result carries it; ``layer_axis``: what an entry of ``layers`` means."""

    metrics: Names = field(default_factory=Names)
    summary: Names = field(default_factory=Names)
    arrays: Names = field(default_factory=Names)
    token_rows: str | None = None
    token_text: str | None = None
    layer_axis: LayerAxis = field(default_factory=LayerAxis)

    def __post_init__(self):
        if isinstance(self.layer_axis, str):  # a description in words: its kind read from the words
            object.__setattr__(self, "layer_axis", LayerAxis.from_text(self.layer_axis))

    def axis(self, result) -> LayerAxis:
        """The layer axis of ``result`` (a StudyResult or a read-back record): the one the run recorded, the
        declared one for a result without it (written before runs recorded their axis)."""
        return getattr(result, "layer_axis", None) or self.layer_axis

    def field(self, key: str) -> Field | None:
        """The declaration of ``key`` among metrics, summary values and arrays (in that order)."""
        for names in (self.metrics, self.summary, self.arrays):
            f = names.field(key)
            if f is not None:
                return f
        return None

    def label(self, key: str, unit: bool = True) -> str:
        """``key``'s human label, with its unit in parentheses (``unit=False``: without); the key itself
        for an undeclared name (an old result)."""
        f = self.field(key)
        if f is None:
            return key
        text = f.heading(key)
        return f"{text} ({f.unit})" if unit and f.unit else text

    def unit(self, key: str) -> str:
        f = self.field(key)
        return "" if f is None else f.unit

    def per_token(self) -> list[Field]:
        """Arrays with axes (layer, token): a value per token at every layer (the token view)."""
        return [f for f in self.arrays if f.axes == ("layer", "token") and not f.label]

    def problems(self, result: "StudyResult") -> list[str]:
        """What in ``result`` breaks this declaration (empty when it is kept)."""
        out = []
        n_layers = len(result.layers)
        for section, values in (("metric", result.metrics), ("summary value", result.summary),
                                ("array", result.arrays)):
            names = {"metric": self.metrics, "summary value": self.summary, "array": self.arrays}[section]
            for key in values:
                if names.field(key) is None:
                    out.append(f"{section} {key!r} is not declared")
        for key, values in result.metrics.items():
            if len(values) != n_layers:
                out.append(f"metric {key!r} has {len(values)} values for {n_layers} layers")
        n_tok = len(result.arrays[self.token_rows]) if self.token_rows in result.arrays else None
        for key, value in result.arrays.items():
            f = self.arrays.field(key)
            a = np.asarray(value)
            if f is None:
                continue
            if a.ndim != len(f.axes):
                out.append(f"array {key!r} has {a.ndim} axes, declared {f.axes}")
                continue
            for axis, size in zip(f.axes, a.shape):
                if axis == "layer" and size != n_layers:
                    out.append(f"array {key!r}: axis 'layer' has {size} entries for {n_layers} layers")
                if axis == "token" and n_tok is not None and size != n_tok:
                    out.append(f"array {key!r}: axis 'token' has {size} entries, {self.token_rows!r} {n_tok}")
        return out


# ---------------------------------------------------------------------------- what a study is given
@dataclass(frozen=True)
class Needs:
    """What a study reads. ``sites``: store sites, every layer, that must exist in the model's family
    (:meth:`lens.model.card.ModelCard.require_site`); ``optional_sites``: read when the family has them;
    ``model``: the loaded model; ``lm_head`` / ``causal``: refuse, before any capture, a model
    without a language-model head / a non-causal one; ``tokens``: the token table of
    ``config.store`` when it exists (nothing is captured for it); ``controls``: (name, transform)
    pairs — the same text captured under a :mod:`lens.text.transforms` transform, beside
    ``config.store`` as ``<store>-<name>``; ``control_tokens``: the most tokens a control is captured
    from (0: as many as the study's store; a study that samples its control says how many it reads, so a
    million-token store does not cost a second million-token capture)."""

    sites: tuple[Site, ...] = ()  # given as Site or as its name ("resid_post"): held as Site
    optional_sites: tuple[Site, ...] = ()
    model: bool = False
    lm_head: bool = False
    causal: bool = False
    tokens: bool = False
    controls: tuple[tuple[str, str], ...] = ()
    control_tokens: int = 0

    def __post_init__(self):
        for name in ("sites", "optional_sites"):
            object.__setattr__(self, name, tuple(Site.parse(s) for s in getattr(self, name)))

    @property
    def reads_store(self) -> bool:
        return bool(self.sites or self.optional_sites)


@runtime_checkable
class StudyCard(Protocol):
    """What a study reads of the model's card (:class:`lens.model.card.ModelCard`; the runner checks the
    card's sites, head and causality itself before a study sees it)."""

    @property
    def model_id(self) -> str: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def is_causal(self) -> bool: ...  # the windows a study cuts itself (layer-ablation)
    @property
    def norm_kind(self) -> NormKind | None: ...  # the fresh norm of norm="auto" (studies.core.config.resolve_norm)
    @property
    def block(self) -> BlockKind: ...  # named when a model has no final norm
    @property
    def absent(self) -> Mapping[str, str]: ...  # site -> why this family lacks it


@runtime_checkable
class StudyModel(Protocol):
    """What a study reads of the loaded model (:class:`lens.LoadedModel`) itself. A study also hands the model
    whole to lens's forward-pass functions (the logit and tuned lens, steering, ablation, span states), which
    take a :class:`lens.LoadedModel`."""

    @property
    def model_id(self) -> str: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def device(self) -> torch.device: ...  # where matmul precision is set (lens.runtime.precision)
    @property
    def dtype(self) -> torch.dtype: ...  # recorded beside the precision
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...  # token text, chat templates, a study's own windows


@runtime_checkable
class StudyStore(Protocol):
    """What a study reads of a store (:class:`lens.Store`, on disk, in memory or on a GPU): its token table,
    which rows enter an analysis, and states by site and layer. A study also hands it whole to
    :func:`lens.readout.store_lens.store_logit_lens`."""

    manifest: dict  # the runner reads the positions it keeps
    tokens: dict[str, np.ndarray]  # numpy columns, one row per token (doc, window, pos, token_id, token, ...)

    @property
    def model_id(self) -> str: ...
    @property
    def n_tokens(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    def mask(self, drop_special: bool = True, min_pos: int = 0) -> np.ndarray: ...
    def layers(self, site: str | Site = ...) -> list[int]: ...
    def view(self, site: str | Site = ..., layers=None, rows=None, dtype=None) -> LayerView: ...
    def get(self, site: str | Site = ..., layer: int | None = None, *, dtype=None, rows=None) -> torch.Tensor: ...


@dataclass(frozen=True)
class Inputs:
    """What the runner prepared: the model's card, and the model / store / control stores the study
    asked for (None when not asked for). ``sites``: the sites to read (required plus the optional
    ones the family has); ``corpus``: the name of the text the store holds (else the config's)."""

    card: StudyCard
    model: StudyModel | None = None
    store: StudyStore | None = None
    controls: dict[str, StudyStore] = field(default_factory=dict)
    sites: tuple[Site, ...] = ()
    corpus: str = ""


# ---------------------------------------------------------------------------- what a study hands back
@dataclass(frozen=True)
class StudyResult:
    """A study's numbers under its declared names. ``layers``: the ``layer`` axis of every metric;
    ``files``: objects with ``save(path)`` written beside ``result.json`` under their name."""

    model: str
    corpus: str
    n_tokens: int
    layers: list
    metrics: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    arrays: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    layer_axis: LayerAxis | None = None  # the axis the run read (set by the runner from its config's site)


def _no_needs(config: StudyConfig) -> Needs:
    return Needs()


@dataclass(frozen=True)
class Study:
    """A study (see the module docstring). ``name`` and ``description`` come from the registry."""

    config: type[StudyConfig]
    result: ResultSpec
    compute: Callable[[StudyConfig, Inputs], StudyResult]
    figures: Callable[[StudyResult, StudyConfig], dict[str, Figure]]
    needs: Callable[[StudyConfig], Needs] = _no_needs
    check: Callable[[StudyConfig], None] | None = None
    headlines: tuple[Headline, ...] = ()
    name: str = ""
    description: str = ""
    # scheduling hints for a parallel main job (studies.job.pool), never part of a result: ``cost``, the
    # expected seconds at the main job's default settings in one single-threaded worker of a 2-core
    # machine (an earlier run's times replace it); ``worker_group``: studies naming the same group run
    # in one worker process, one after the other, so they share what that process keeps in memory
    cost: float = 60.0
    worker_group: str | None = None
    # why the study needs every position of each window ("" when any rows of the store will do): the
    # runner refuses a store captured with --positions last / every:K / ... for it, naming this reason
    needs_all_positions: str = ""
    claims: tuple[Claim, ...] = ()
