"""The study contract: what a study declares, what the runner gives it and what it hands back.

A study is one module of ``studies/`` holding ``STUDY = Study(...)`` and one line in
:mod:`studies.registry`. It declares, as values the runner, the main job, the report and the
explorer read:

- ``config``: a frozen dataclass extending :class:`studies.config.StudyConfig`, every field defaulted;
- ``needs(config) -> Needs``: the store sites it reads, whether it needs the model (an LM head, a
  causal model), control stores under a corpus transform — the main job asks this, it never guesses;
- ``check(config)``: validation that needs nothing loaded (runs before any model or capture);
- ``result``: a :class:`ResultSpec` naming every metric, summary value and array with its axes. It is
  the one place a result name is spelled: the study writes ``M.pr``, the explorer reads ``M.pr``,
  and the runner refuses a result that uses an undeclared name;
- ``compute(config, inputs) -> StudyResult``: the numbers (no files, no figures);
- ``figures(result, config) -> {name: plotly Figure}``: drawn from the result alone ("main" first);
- ``headlines``: :class:`Headline` rows (a value read from a result record, beside a seed claim).

:func:`studies.runner.run_study` composes them: prepare (load, capture or open, check the model card)
→ compute → figures → write the results folder. A faster implementation of a study replaces
``compute`` (or hands the runner a store on another device) and keeps everything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


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


def _attr(name: str, attr: str | None) -> str:
    attr = attr or name.replace("{}", "").strip("_")
    if not attr.isidentifier():
        raise ValueError(f"declared name {name!r} needs an attribute name (got {attr!r})")
    return attr


def metric(name: str, doc: str, attr: str | None = None) -> Field:
    """A per-layer metric: one value per entry of the result's ``layers``."""
    return Field(name, doc, ("layer",), _attr(name, attr))


def scalar(name: str, doc: str, attr: str | None = None) -> Field:
    """A summary value (a number, a string or a small list)."""
    return Field(name, doc, (), _attr(name, attr))


def array(name: str, axes: str, doc: str, attr: str | None = None, label: bool = False) -> Field:
    """An array of ``arrays.npz``; ``axes``: space-separated axis names, e.g. ``"layer token"``;
    ``label``: it holds ids or strings (a token's top-1 id), not a measurement to colour text by."""
    return Field(name, doc, tuple(axes.split()), _attr(name, attr), label)


class Names:
    """The declared names of one section of a result, by attribute: ``M.pr == "pr"``; a family is
    returned as its :class:`Field` (call it to spell a member)."""

    def __init__(self, *fields: Field):
        self._fields = {}
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
    layer_axis: str = "block l (resid_post)"

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
    ``config.store`` as ``<store>-<name>``."""

    sites: tuple[str, ...] = ()
    optional_sites: tuple[str, ...] = ()
    model: bool = False
    lm_head: bool = False
    causal: bool = False
    tokens: bool = False
    controls: tuple[tuple[str, str], ...] = ()

    @property
    def reads_store(self) -> bool:
        return bool(self.sites or self.optional_sites)


@dataclass(frozen=True)
class Inputs:
    """What the runner prepared: the model's card, and the model / store / control stores the study
    asked for (None when not asked for). ``sites``: the sites to read (required plus the optional
    ones the family has); ``corpus``: the name of the text the store holds (else the config's)."""

    card: Any
    model: Any = None
    store: Any = None
    controls: dict = field(default_factory=dict)
    sites: tuple[str, ...] = ()
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


@dataclass(frozen=True)
class Headline:
    """A headline number: ``value(record)`` read from a :class:`studies.results.ResultRecord`,
    beside the claim from the seed papers it is checked against."""

    label: str
    value: Callable
    claim: str


def _no_needs(config) -> Needs:
    return Needs()


@dataclass(frozen=True)
class Study:
    """A study (see the module docstring). ``name`` and ``description`` come from the registry."""

    config: type
    result: ResultSpec
    compute: Callable
    figures: Callable
    needs: Callable = _no_needs
    check: Callable | None = None
    headlines: tuple = ()
    name: str = ""
    description: str = ""
    # scheduling hints for a parallel main job (studies.job_pool), never part of a result: ``cost``, the
    # expected seconds at the main job's default settings in one single-threaded worker of a 2-core
    # machine (an earlier run's times replace it); ``worker_group``: studies naming the same group run
    # in one worker process, one after the other, so they share what that process keeps in memory
    cost: float = 60.0
    worker_group: str | None = None
    # why the study needs every position of each window ("" when any rows of the store will do): the
    # runner refuses a store captured with --positions last / every:K / ... for it, naming this reason
    needs_all_positions: str = ""
