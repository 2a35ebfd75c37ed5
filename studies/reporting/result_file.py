"""``result.json`` as a frozen value (issue #41): parsed and checked once (:meth:`ResultFile.from_dict`), written
back key for key (:meth:`ResultFile.to_dict`), as the store's manifest is (:mod:`lens.store.manifest`).

A record from an older version reads as it did: a field it lacks takes its default (``corpus`` "", ``n_tokens``
0, no ``layer_axis``: the axis is then read as the study declares it) and is not written back; a field this
version does not know is kept in ``unknown`` and written back; a ``layer_axis`` not of the axis' shape reads as
absent (as :meth:`LayerAxis.from_dict` reads it) and is written back as it was. A malformed record: ``LensInputError`` naming the file and what was expected, one
line. Torch-free: the explorer's data layer reads results through it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lens.errors import LensInputError
from lens.runtime.frozen_json import FrozenDict, freeze, ordered, thaw
from studies.core.axis import LayerAxis

RESULT_FILE = "result.json"
REQUIRED = ("study", "model", "layers", "metrics", "summary")
# the fields a study writes, in the order it writes them (write_result)
ORDER = ("schema_version", "study", "model", "corpus", "n_tokens", "config", "versions", "git_revision", "created",
         "wall_time_s", "layers", "metrics", "summary", "extra", "layer_axis")
_DEFAULTS: dict[str, Any] = {"corpus": "", "n_tokens": 0, "config": FrozenDict(), "versions": FrozenDict(),
                             "git_revision": "", "created": "", "wall_time_s": None, "extra": FrozenDict(),
                             "schema_version": None}


def _problem(data: Mapping) -> str | None:
    """What in a record's fields does not have the shape a study writes, or None."""
    for key in ("study", "model"):
        if not isinstance(data[key], str):
            return f"{key} must be a string, got {type(data[key]).__name__}"
    layers = data["layers"]
    if not isinstance(layers, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
        return "layers must be a list of layer numbers"
    for key in ("metrics", "summary", "config", "extra", "versions"):
        if not isinstance(data.get(key, {}), dict):
            return f"{key} must be a JSON object, got {type(data[key]).__name__}"
    for name, values in data["metrics"].items():
        if not isinstance(values, list) or len(values) != len(layers):
            got = f"{len(values)} values" if isinstance(values, list) else type(values).__name__
            return f"metric {name!r} must hold one value per layer ({len(layers)}), got {got}"
    if not isinstance(data.get("n_tokens", 0), int) or isinstance(data.get("n_tokens", 0), bool):
        return "n_tokens must be a whole number"
    return None


@dataclass(frozen=True)
class ResultFile:
    """One study's ``result.json``: what it ran on, its per-layer ``metrics`` (name -> one value per layer, NaN
    as None), its scalar ``summary``, and the layer axis it read (None: read as declared)."""

    study: str
    model: str
    layers: tuple[int, ...]
    metrics: Mapping[str, Any]
    summary: Mapping[str, Any]
    corpus: str = ""
    n_tokens: int = 0
    config: Mapping[str, Any] = field(default_factory=FrozenDict)
    versions: Mapping[str, Any] = field(default_factory=FrozenDict)
    git_revision: str = ""
    created: str = ""
    wall_time_s: float | None = None
    extra: Mapping[str, Any] = field(default_factory=FrozenDict)
    layer_axis: LayerAxis | None = None
    schema_version: int | None = None
    unknown: Mapping[str, Any] = field(default_factory=FrozenDict)  # fields this version does not know
    key_order: tuple[str, ...] = field(default=(), repr=False, compare=False)  # the JSON's key order
    absent: frozenset[str] = field(default=frozenset(), repr=False, compare=False)  # optional fields not in it

    @classmethod
    def from_dict(cls, data: Any, where: str = RESULT_FILE) -> "ResultFile":
        """The record the JSON value ``data`` holds, checked once: ``LensInputError("<where> ...")`` when it is
        not one."""
        if not isinstance(data, dict):
            raise LensInputError(f"{where} is not a result record: expected a JSON object, got {type(data).__name__}")
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise LensInputError(f"{where} lacks {', '.join(missing)}")
        problem = _problem(data)
        if problem:
            raise LensInputError(f"{where} is not a result record as a study writes it: {problem}")
        unknown = {k: v for k, v in data.items() if k not in ORDER}
        axis = LayerAxis.from_dict(data.get("layer_axis"))
        if "layer_axis" in data and (axis is None or axis.to_dict() != data["layer_axis"]):
            unknown["layer_axis"] = data["layer_axis"]  # not exactly the axis' shape: written back as it was
        optional = {k: freeze(data[k]) for k in _DEFAULTS if k in data}
        return cls(study=data["study"], model=data["model"], layers=tuple(data["layers"]),
                   metrics=freeze(data["metrics"]), summary=freeze(data["summary"]), layer_axis=axis,
                   unknown=freeze(unknown), key_order=tuple(data),
                   absent=frozenset(k for k in (*_DEFAULTS, "layer_axis") if k not in data), **optional)

    def to_dict(self) -> dict:
        """The JSON object (fresh, mutable), key for key as it was read (as a study writes it when built here)."""
        values: dict = {"study": self.study, "model": self.model, "layers": list(self.layers),
                        "metrics": thaw(self.metrics), "summary": thaw(self.summary)}
        for key in _DEFAULTS:
            if key not in self.absent:
                values[key] = thaw(getattr(self, key))
        if self.layer_axis is not None and "layer_axis" not in self.unknown:
            values["layer_axis"] = self.layer_axis.to_dict()
        values.update((k, thaw(v)) for k, v in self.unknown.items())
        return ordered(values, self.key_order or ORDER)

    @classmethod
    def read(cls, file) -> "ResultFile":
        """``file`` (a ``result.json``) read and checked; any problem is one ``LensInputError`` line naming it."""
        file = Path(file)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise LensInputError(f"{file} is not valid JSON ({exc.msg})") from None
        except UnicodeDecodeError as exc:
            raise LensInputError(f"{file} is not UTF-8 text (byte {exc.start} is invalid)") from None
        except RecursionError:
            raise LensInputError(f"{file} is not a result record (JSON nested too deeply)") from None
        return cls.from_dict(data, str(file))
