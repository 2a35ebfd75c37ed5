"""Each study's headline to a declared precision (issue #38), and the one name of a study's sample size (#41).

A study declares, in ``studies/<study>/declaration.py``, ``PRECISION = Precision(...)``: the headline its sample
is sized for (read from a result record with its 95% interval, as a :class:`studies.core.contract.Claim` reads
its value), the precision it is reported to (``half_width``: the half-width of that interval, in the headline's
units), the config field that sizes the sample (``knob``) and its default, and the sample-size curve that chose
the default (the headline and its interval at 4-5 sizes on the default model, with the command that made it).
The default is the smallest curve size whose interval reached the declared half-width.

**The sample-size knob.** A study that analyses a sample of tokens sizes it with one field, ``sample_tokens``
(:data:`SAMPLE_TOKENS`): the tokens the study's headline is computed on, whole windows drawn at random (seeded)
over the store or the corpus, 0 = every token there is. The old names (``lens_tokens``, ``eval_tokens``,
``max_probe_tokens``, ``max_sample_tokens``, ``max_points``) are still read, with a warning, for one release
(:data:`RENAMED`, :func:`renamed_params`). A study whose sample is not tokens names its own unit (``max_lemmas``,
``max_facts``); a study whose sample is the whole store (``max_tokens``) declares that.

**A requested precision.** ``lens study NAME --precision H`` (``all``: ``--precision NAME=H``) asks for the
headline to ±H: the sample grows as the interval narrows, 1/√n, so the knob becomes
``default × (half_width / H)²`` (:func:`sample_for`), capped by what the store holds. H must be a positive number
no larger than the declared half-width (a coarser headline than the default's is not what the option is for);
anything else is refused in one line. A result records the precision reached beside the target
(``result.json``'s ``extra["precision"]``, :func:`reached`).

This module imports neither torch nor a study: the declarations import it.
"""

from __future__ import annotations

import importlib
import logging
import math
import warnings
from dataclasses import dataclass
from typing import Callable

from lens.errors import LensInputError
from studies.core.registry import STUDIES, declaration_module

log = logging.getLogger(__name__)

SAMPLE_TOKENS = "sample_tokens"
# the fewest units (documents, windows, lemmas, facts) a default sample's interval resamples: the project's rule
# for a document-resampled interval (studies.core.sampling.split_units: documents when there are 10 or more)
MIN_UNITS = 10
# old spellings of the sample-size knob, read with a warning for one release (issue #41)
RENAMED = {"lens_tokens": SAMPLE_TOKENS, "eval_tokens": SAMPLE_TOKENS, "max_probe_tokens": SAMPLE_TOKENS,
           "max_sample_tokens": SAMPLE_TOKENS, "max_points": SAMPLE_TOKENS}


@dataclass(frozen=True)
class Precision:
    """A study's declared precision (see the module docstring).

    ``label`` / ``unit``: the headline in words and its unit; ``value`` / ``low`` / ``high``: read it and its 95%
    interval from a result record (``studies.reporting.headlines`` readers); ``half_width``: the declared
    precision; ``knob``: the config field sizing the sample, ``default`` its default; ``curve``: (sample, value,
    low, high) rows on ``model`` measured with ``command``; ``scales``: False where the knob does not size the
    headline's sample (a study whose headline reads the whole store): ``--precision`` is then refused;
    ``note``: what a reader of the curve needs to know; ``min_sample``: the smallest sample whose interval
    resamples at least :data:`MIN_UNITS` units (windows of 128 tokens, lemmas, facts) — below it a bootstrap
    interval is too narrow to trust, so no default goes under it whatever its half-width; ``missed``: sizes that
    reached the precision on the curve's store but not when re-checked on another (a 4000-token store of the same
    model: tests/studies/core/test_precision_targets.py), so that a lucky draw does not make the default."""

    label: str
    unit: str
    value: Callable
    low: Callable
    high: Callable
    half_width: float
    knob: str
    default: int
    curve: tuple = ()
    command: str = ""
    model: str = "smollm2-135m"
    scales: bool = True
    note: str = ""
    min_sample: int = 0
    missed: tuple = ()

    def chosen(self) -> int | None:
        """The default the curve gives: its smallest size of at least ``min_sample`` whose interval reached
        ``half_width`` and that the re-check did not find short of it (``missed``; None when none did)."""
        ok = [n for n, _, low, high in self.curve
              if n >= self.min_sample and n not in self.missed and low is not None and high is not None
              and (high - low) / 2 <= self.half_width]
        return min(ok) if ok else None

    def read(self, record) -> tuple:
        """(value, low, high) of the headline in ``record`` (None where the record lacks one)."""
        out = []
        for get in (self.value, self.low, self.high):
            try:
                v = get(record)
            except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError):
                v = None
            out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool)
                       and math.isfinite(float(v)) else None)
        return tuple(out)


def declared_precision(study: str) -> Precision | None:
    """The ``PRECISION`` the registered ``study`` declares, or None."""
    if study not in STUDIES:
        return None
    try:
        mod = importlib.import_module(declaration_module(study))
    except ModuleNotFoundError:
        return None
    return getattr(mod, "PRECISION", None)


def renamed_params(values: dict, fields) -> dict:
    """``values`` (a study's parameters) with an old name of the sample knob replaced by its new one, where the
    config has the new one (a warning says so); the same name given both ways is refused."""
    out = dict(values)
    for key in list(values):
        name = key.replace("-", "_")
        new = RENAMED.get(name)
        if new is None or name in fields or new not in fields:
            continue
        if new in out and new != name:
            raise LensInputError(f"{name} is the old name of {new}: give one of them, not both")
        msg = f"parameter {name} is now called {new} (the old name is read for one release)"
        warnings.warn(msg, DeprecationWarning, stacklevel=3)
        log.warning(msg)
        out[new] = out.pop(key)
    return out


def parse_target(study: str, raw, precision: Precision | None) -> float:
    """A ``--precision`` value for ``study`` as a float, or :class:`lens.errors.LensInputError` in one line."""
    if precision is None or not precision.scales:
        why = "declares no precision" if precision is None else \
            f"reads its headline on the whole store: raise --max-tokens instead"
        raise LensInputError(f"--precision: {study} {why}")
    try:
        target = float(raw)
    except (TypeError, ValueError):
        raise LensInputError(f"--precision: {study} expects a number (the half-width of its headline's 95% "
                             f"interval, in {precision.unit}), got {raw!r}") from None
    if not math.isfinite(target) or target <= 0 or target > precision.half_width:
        raise LensInputError(f"--precision: {study} expects a half-width in (0, {precision.half_width:g}] "
                             f"{precision.unit} (its declared precision is ±{precision.half_width:g}), got {raw!r}")
    return target


def sample_for(precision: Precision, target: float) -> int:
    """The knob's value that reaches ±``target``: the default grown as 1/√n narrows the interval."""
    return int(math.ceil(precision.default * (precision.half_width / target) ** 2))


def reached(precision: Precision, record, target: float | None = None) -> dict:
    """What ``result.json`` records of the precision: the headline, the half-width its interval reached, the
    target (the requested one, else the declared one) and the sample it was computed on."""
    value, low, high = precision.read(record)
    half = None if low is None or high is None else abs(high - low) / 2
    goal = target if target else precision.half_width
    return {"headline": precision.label, "unit": precision.unit, "value": value, "half_width": half,
            "target": goal, "requested": bool(target), "knob": precision.knob,
            "sample": record.config.get(precision.knob) if hasattr(record, "config") else None,
            "reached": None if half is None else bool(half <= goal)}


# the command that measured every declared curve (benchmarks/sample_size_curves.py; docs/sample_sizes.md)
CURVE_COMMAND = ("LENS_NUM_THREADS=1 python benchmarks/sample_size_curves.py --store results/store --runs /tmp/curves "
                 "--reference results  # results: make demo's folder before issue #38's defaults")


def parse_targets(items, studies) -> dict[str, float]:
    """``--precision`` values (``H`` for one study, ``NAME=H`` for any of ``studies``; repeatable) as
    {study: half-width}, each checked (:func:`parse_target`); a bad one is refused in one line."""
    studies = list(studies)
    out = {}
    for item in items or ():
        name, sep, raw = str(item).rpartition("=")
        if not sep:
            if len(studies) != 1:
                raise LensInputError(f"--precision: with several studies give NAME=HALF_WIDTH (units differ between "
                                     f"studies), got {item!r}")
            name, raw = studies[0], item
        name = name.strip()
        if name not in studies:
            raise LensInputError(f"--precision: {name!r} is not a study of this run (expected one of "
                                 f"{', '.join(studies)})")
        out[name] = parse_target(name, raw.strip(), declared_precision(name))
    return out


def target_params(study: str, target: float) -> dict:
    """The config values that ask ``study`` for ±``target``: its knob sized by :func:`sample_for`, and the target."""
    precision = declared_precision(study)
    return {precision.knob: sample_for(precision, target), "target_half_width": target}
