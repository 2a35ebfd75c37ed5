"""Headline numbers: each study declares its own (:class:`studies.core.contract.Headline`, in its module);
this module reads them for a result record and formats them.

The main job prints one line per study from these, the report puts them in its summary table and the
explorer's overview shows them. A headline reads only a ``ResultRecord`` (``summary`` scalars and
per-layer ``metrics``), so it works for any results folder, old or new; a missing key gives ``None``.
"""

from __future__ import annotations

import math

from studies.core import stability
from studies.core.contract import NOT_APPLICABLE
from studies.core.registry import declaration


def summary(name: str):
    """The summary value ``name``."""
    return lambda rec: rec.summary.get(name)


def metric_last(name: str):
    """The metric's value at the last layer."""
    def get(rec):
        values = [v for v in rec.metrics.get(name, []) if v is not None]
        return values[-1] if values else None
    return get


def metric_max(name: str):
    """The metric's largest value over layers."""
    def get(rec):
        values = [v for v in rec.metrics.get(name, []) if v is not None]
        return max(values) if values else None
    return get


def argmax_depth(name: str):
    """Relative depth (0 = first layer, 1 = last) of the metric's maximum."""
    def get(rec):
        vals = rec.metrics.get(name, [])
        pairs = [(v, i) for i, v in enumerate(vals) if v is not None]
        if len(pairs) < 2:
            return None
        return max(pairs)[1] / (len(vals) - 1)
    return get


def drop_share_after_mid(name: str):
    """Share of the metric's whole fall made after the middle layer, the fall measured from its highest value
    at or before mid depth down to the last layer: 1 when it all falls late, 0 when it has all fallen by mid
    depth (or rises again after it). A curve that first rises (cross-entropy often does in the first layers)
    thus stays within 0–1: measured from layer 0 instead, the share would pass 1 by the rise."""
    def get(rec):
        vals = [v for v in rec.metrics.get(name, []) if v is not None]
        if len(vals) < 3:
            return None
        mid = len(vals) // 2
        top = max(vals[: mid + 1])
        if not top > vals[-1]:
            return 0.0  # it does not fall: nothing of a fall comes late
        return min(1.0, max(0.0, (vals[mid] - vals[-1]) / (top - vals[-1])))
    return get


def difference(first: str, second: str):
    """Summary value ``first`` minus summary value ``second``."""
    def get(rec):
        a, b = rec.summary.get(first), rec.summary.get(second)
        return None if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) else a - b
    return get


def pair(first: str, second: str, sep: str = " vs "):
    """Two summary values side by side (``a vs b``)."""
    def get(rec):
        a, b = rec.summary.get(first), rec.summary.get(second)
        return None if a is None or b is None else f"{format_value(a)}{sep}{format_value(b)}"
    return get


def format_value(value) -> str:
    """Numbers to 3 decimals (or 3 significant digits when tiny or huge), ``—`` for missing."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.3g}"
        return f"{value:.3f}"
    return str(value)


def declared_headlines(study: str) -> tuple:
    """The headlines the registered study ``study`` declares (none for an unregistered one)."""
    found = declaration(study)
    return found.headlines if found is not None else ()


def headlines_for(record) -> list[dict]:
    """Rows {study, label, value, text, claim} for one result; values that fail to compute are ``None``."""
    rows = []
    for h in declared_headlines(record.study):
        try:
            value = h.value(record)
        except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError):
            value = None
        text = format_value(value)
        rows.append({"study": record.study, "label": h.label, "value": value,
                     "text": text, "claim": h.claim})
    return rows


def one_line(record) -> str:
    """``label = value`` for the study's headlines, for the main job's summary line."""
    rows = [r for r in headlines_for(record) if r["value"] is not None]
    if not rows:
        keys = list(record.summary)[:3]
        return ", ".join(f"{k}={format_value(record.summary[k])}" for k in keys) or "no summary"
    return "; ".join(f"{r['label']} = {r['text']}" for r in rows[:3])


def declared_claims(study: str) -> tuple:
    """The claims the registered study ``study`` declares (none for an unregistered one)."""
    found = declaration(study)
    return found.claims if found is not None else ()


def _read(get, record):
    if get is None:
        return None
    try:
        return get(record)
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError):
        return None


def judged(record) -> list[dict]:
    """One row per seed claim the study declares: {study, measure, value, text, low, high, interval,
    verdict, rule, claim, source, figure, unit, paper, method, instrument, reason, nested, nested_n, unstable,
    null, null_p, store_mark}. The verdict comes from the claim's one declared rule (:class:`studies.core.contract.Rule`)
    applied to the measured value and its interval (``undecided`` when the interval straddles a threshold);
    a claim whose ``applicable`` gives a reason is ``not applicable`` with it (``reason``). ``nested``: the
    value on nested subsamples N/4, N/2, N and ``unstable`` whether it moved by more than its interval
    (:mod:`studies.core.stability`); ``null`` / ``null_p``: the study's null and the p-value against it."""
    rows = []
    for c in declared_claims(record.study):
        value, low, high = _read(c.value, record), _read(c.low, record), _read(c.high, record)
        interval = "" if low is None or high is None else f"[{format_value(low)}, {format_value(high)}]"
        reason = _read(c.applicable, record) or ""
        verdict = NOT_APPLICABLE if reason else c.rule.verdict(value, low, high)
        nested = record.summary.get(stability.NESTED.format(c.key)) if c.key else None
        nested = nested if isinstance(nested, list) else None
        rows.append({"study": record.study, "measure": c.measure, "value": value, "text": format_value(value),
                     "low": low, "high": high, "interval": interval, "verdict": verdict,
                     "rule": c.rule.text, "claim": c.claim, "source": c.source, "figure": c.figure, "unit": c.unit,
                     "paper": c.paper, "method": c.method, "instrument": c.instrument, "reason": str(reason),
                     "nested": nested,
                     "nested_n": record.summary.get(stability.NESTED_N.format(c.key)) if c.key else None,
                     "unstable": stability.is_unstable(nested, low, high) if nested else None,
                     "null": record.summary.get(stability.NULL.format(c.key)) if c.key else None,
                     "null_p": record.summary.get(stability.NULL_P.format(c.key)) if c.key else None,
                     "store_mark": store_mark(record)})
    return rows


def store_mark(record) -> str:
    """The mark of a result computed from a store whose fidelity check is silently wrong (kept with
    --allow-silently-wrong, or a merged store with such a part: studies.core.runner.store_fidelity);
    "" for any other."""
    fidelity = (record.extra or {}).get("store_fidelity")
    if not isinstance(fidelity, dict) or fidelity.get("verdict") != "silently-wrong":
        return ""
    kept = " (kept with --allow-silently-wrong)" if fidelity.get("accepted") else ""
    return f"computed from a store whose fidelity check is SILENTLY WRONG{kept}: {fidelity.get('line', '')}"


def verdict_text(row: dict) -> str:
    """A judged row's verdict in words, with what qualifies it: the reason it is not applicable, the instrument
    when ours differs from the paper's, an unstable value, the p-value against the null."""
    text = row["verdict"]
    if row.get("reason"):
        text += f": {row['reason']}"
    notes = [row["store_mark"]] if row.get("store_mark") else []
    if row.get("instrument"):
        notes.append(row["instrument"])
    if row.get("unstable"):
        notes.append("unstable: moves by more than its interval on nested subsamples")
    if row.get("null_p") is not None:
        notes.append(f"null p = {format_value(row['null_p'])}")
    return f"{text} ({'; '.join(notes)})" if notes else text


def nested_text(row: dict) -> str:
    """``0.91 / 0.93 / 0.92 (stable)`` for N/4, N/2, N; ``—`` without nested values."""
    vals = row.get("nested")
    if not vals:
        return "—"
    mark = {True: " (unstable)", False: " (stable)", None: ""}[row.get("unstable")]
    return " / ".join(format_value(v) for v in vals) + mark
