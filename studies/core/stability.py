"""Can a headline carry a verdict? Its value on nested subsamples, and its value against a null.

Two checks every judged number gets, one definition each (issue #37; they replace the old
"4 training tokens per dimension" rule, which did not predict when a judged statistic is stable):

- **Stability on nested subsamples.** The headline is computed again on nested subsamples of the units a
  study resamples (documents where there are enough, else windows: :func:`studies.core.sampling.split_units`):
  a seeded random quarter of the units, a half that contains that quarter, and all of them
  (:data:`NESTED_FRACTIONS`). It is **unstable** when a smaller subsample's value moves from the full
  sample's by more than the width of the full sample's 95% interval (:func:`is_unstable`): noise alone
  moves the half-sample value by about one standard error of the full one, a quarter of the interval's
  width, so a larger move is a drift with sample size (an in-sample fit that has not converged), not noise.
- **A null.** A geometry number (anisotropy, intrinsic dimension, linearity, participation ratio) is
  compared with the same number on data that has the structure removed (shuffled tokens, permuted pairings,
  an isotropic cloud of the same spectrum): :func:`add_one_p` is the permutation p-value
  ``(1 + #{null ≥ observed}) / (1 + n_null)`` (Phipson & Smyth 2010: never 0, exact under the null).

A study writes the results under its headline's key with the declared families :data:`SCALARS`
(``nested__<key>``: the values at N/4, N/2, N; ``nested_n__<key>``: the tokens in each; ``null__<key>``: the
null's value, ``null_p__<key>``: the p-value) and names that key in its :class:`studies.core.contract.Claim`
(``key=``); :func:`studies.reporting.headlines.judged` reads them back.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from studies.core.contract import scalar

NESTED_FRACTIONS = (0.25, 0.5, 1.0)
NESTED, NESTED_N, NULL, NULL_P = "nested__{}", "nested_n__{}", "null__{}", "null_p__{}"
SCALARS = (
    scalar(NESTED, "the headline {} computed on nested subsamples of the units (a quarter, a half holding it, "
                   "all): studies.core.stability", title="{} on nested subsamples N/4, N/2, N"),
    scalar(NESTED_N, "tokens in each nested subsample of the headline {}", title="{}: tokens in N/4, N/2, N",
           unit="tokens"),
    scalar(NULL, "the headline {} on the study's null (structure removed)", title="{} under the null"),
    scalar(NULL_P, "add-one permutation p-value of the headline {} against its null",
           title="{}: p-value against the null", unit="p-value"),
)


def nested_units(units: np.ndarray, seed: int = 0, fractions: Sequence[float] = NESTED_FRACTIONS
                 ) -> list[np.ndarray]:
    """Boolean row masks of nested subsamples: for each fraction f, the rows of the first ceil(f × n) units of
    one seeded random order of the distinct units (so each mask holds the ones before it)."""
    units = np.asarray(units)
    uniq = np.unique(units)
    order = np.random.default_rng(seed).permutation(uniq)
    masks = []
    for f in fractions:
        if not 0 < f <= 1:
            raise ValueError(f"nested fraction must be in (0, 1], got {f}")
        k = max(1, int(math.ceil(f * len(order))))
        masks.append(np.isin(units, order[:k]))
    return masks


def nested_values(statistic: Callable[[np.ndarray], object], units: np.ndarray, seed: int = 0,
                  fractions: Sequence[float] = NESTED_FRACTIONS) -> tuple[list, list[int]]:
    """(values, sizes): ``statistic(mask)`` on each nested subsample (None where it raises ValueError, e.g. too
    few points) and the rows in each. ``statistic`` takes a boolean mask over ``units``' rows."""
    values, sizes = [], []
    for mask in nested_units(units, seed, fractions):
        try:
            v = statistic(mask)
        except ValueError:
            v = None
        values.append(None if v is None else float(v))
        sizes.append(int(mask.sum()))
    return values, sizes


def record(key: str, values: Sequence, sizes: Sequence[int]) -> dict:
    """The summary entries for ``key``'s nested values (splice into a study's summary)."""
    return {NESTED.format(key): [None if v is None or not math.isfinite(v) else round(float(v), 6) for v in values],
            NESTED_N.format(key): [int(n) for n in sizes]}


def is_unstable(values: Sequence, low, high) -> bool | None:
    """Whether a value on a smaller nested subsample moved from the full sample's (the last value) by more
    than the width of the full sample's interval [low, high]; None when it cannot be told (no interval, or
    fewer than two values)."""
    vals = [v for v in (values or []) if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(vals) < 2 or values[-1] is None or low is None or high is None:
        return None
    try:
        width = abs(float(high) - float(low))
    except (TypeError, ValueError):
        return None
    if not math.isfinite(width):
        return None
    full = float(values[-1])
    return any(abs(float(v) - full) > width for v in values[:-1] if v is not None)


def add_one_p(observed: float, null: Sequence[float], greater: bool = True) -> float:
    """Permutation p-value ``(1 + #{null at least as extreme}) / (1 + n)``: ``greater`` counts null values
    ≥ the observed one (the effect is a large value), else ≤."""
    null = np.asarray([v for v in null if v is not None and math.isfinite(v)], float)
    if not null.size:
        raise ValueError("add_one_p: the null holds no finite value")
    hits = int((null >= observed).sum() if greater else (null <= observed).sum())
    return (1 + hits) / (1 + null.size)


def null_record(key: str, null_value: float, p: float) -> dict:
    """The summary entries for ``key``'s null."""
    return {NULL.format(key): round(float(null_value), 6), NULL_P.format(key): round(float(p), 6)}
