"""Judged claims of the study contract (:mod:`studies.core.contract`): the verdict words, the :class:`Rule`
that judges a value against a seed paper's claim, the :class:`Claim` that names that value and its rule, and a
:class:`Headline` number beside a claim. Plain data: importing it loads neither torch nor lens."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # names for annotations only
    from studies.reporting.results import ResultRecord

AGREES, WEAKER, CONTRADICTS, UNDECIDED, NOT_APPLICABLE = (
    "agrees", "weaker", "contradicts", "undecided", "not applicable")
VERDICTS = (AGREES, WEAKER, CONTRADICTS, UNDECIDED, NOT_APPLICABLE)


def _number(value) -> float | None:
    """``value`` as a finite float, else None (bools, text, NaN and missing values are no number)."""
    if value is None or isinstance(value, (bool, str)):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Rule:
    """One declared rule that turns a measured value into a verdict, written as data.

    Numbers: ``agrees`` is the interval the paper claims (``None`` = unbounded on that side); a value
    inside it agrees. ``weaker``: intervals where the effect points the paper's way but falls short of
    its threshold. Anything else contradicts. Text values (a token class): ``agrees_in`` /
    ``weaker_in`` are sets of values. A missing value (or a non-finite one) is not applicable.
    ``text``: the rule in words, shown beside the verdict.

    With the value's interval (``low``, ``high``: a 95% interval), a verdict is only given when the whole
    interval falls on one side of every threshold of the rule; an interval that straddles one is
    **undecided** (the sample cannot tell which side the value lies on)."""

    text: str
    agrees: tuple = (None, None)
    weaker: tuple = ()
    agrees_in: frozenset = frozenset()
    weaker_in: frozenset = frozenset()

    @staticmethod
    def _inside(value: float, bounds) -> bool:
        lo, hi = bounds
        return (lo is None or value >= lo) and (hi is None or value <= hi)

    def thresholds(self) -> list[float]:
        """Every finite bound of the rule's intervals, ascending (where its verdict can change)."""
        cuts = {float(b) for bounds in (self.agrees, *self.weaker) for b in bounds if b is not None}
        return sorted(cuts)

    def point_verdict(self, value) -> str:
        """The verdict of the value alone (no interval)."""
        if value is None or isinstance(value, bool):
            return NOT_APPLICABLE
        if isinstance(value, str):
            if not (self.agrees_in or self.weaker_in):
                return NOT_APPLICABLE
            return AGREES if value in self.agrees_in else WEAKER if value in self.weaker_in else CONTRADICTS
        value = _number(value)
        if value is None or self.agrees_in or self.weaker_in:
            return NOT_APPLICABLE
        if self._inside(value, self.agrees):
            return AGREES
        if any(self._inside(value, b) for b in self.weaker):
            return WEAKER
        return CONTRADICTS

    def verdict(self, value, low=None, high=None) -> str:
        """The value's verdict; ``undecided`` when its interval [low, high] holds a threshold of the rule
        strictly inside it, or its two ends get different verdicts. Without an interval: the point's verdict."""
        point = self.point_verdict(value)
        lo, hi = _number(low), _number(high)
        if point == NOT_APPLICABLE or lo is None or hi is None or isinstance(value, str):
            return point
        lo, hi = min(lo, hi), max(lo, hi)
        ends = {self.point_verdict(lo), self.point_verdict(hi), point}
        if len(ends) > 1 or any(lo < t < hi for t in self.thresholds()):
            return UNDECIDED
        return point


@dataclass(frozen=True)
class Claim:
    """A seed paper's claim, judged: ``value(record)`` is the measured value (from a
    :class:`studies.reporting.results.ResultRecord`), ``low`` / ``high`` its 95% interval where the study has one,
    ``rule`` the one :class:`Rule` that judges it, ``figure`` the saved figure that shows it.

    What a reviewer needs to sign the verdict, said once here:

    - ``paper``: the paper's own statistic and where it stands in the paper (the sentence, table or figure,
      and its numbers), e.g. "mean retained accuracy over intervened layers, 72–95% per model (Lad et al.
      2024, Fig. 2)";
    - ``method``: how ours computes the same thing (which layers, which aggregate, which fit, which control);
    - ``instrument``: non-empty where ours is a different instrument from the paper's; it is shown with the
      verdict ("with a linear k-token probe, not the paper's decoder");
    - ``applicable(record)``: a reason (text) when the claim cannot be judged on this result (the logit lens
      is worse than uniform), else None or "";
    - ``key``: the summary key the stability and null records hang on (:mod:`studies.core.stability`):
      ``nested__<key>`` (the value on nested subsamples N/4, N/2, N) and ``null_p__<key>`` /
      ``null__<key>`` (the add-one p-value against the study's null and the null's value)."""

    measure: str
    claim: str
    source: str
    value: Callable[[ResultRecord], object]
    rule: Rule
    low: Callable[[ResultRecord], object] | None = None
    high: Callable[[ResultRecord], object] | None = None
    figure: str = "main"
    unit: str = ""
    paper: str = ""
    method: str = ""
    instrument: str = ""
    applicable: Callable[[ResultRecord], str | None] | None = None
    key: str = ""


@dataclass(frozen=True)
class Headline:
    """A headline number: ``value(record)`` read from a :class:`studies.reporting.results.ResultRecord`,
    beside the claim from the seed papers it is checked against."""

    label: str
    value: Callable[[ResultRecord], object]
    claim: str
