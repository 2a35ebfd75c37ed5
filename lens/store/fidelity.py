"""The fidelity record a store keeps in its manifest (``manifest["fidelity"]``), and how it is shown.

At capture, before anything is written, a probe batch (the first windows of the capture, or of its part)
is run through the capture's own backend and through the plain Hugging Face forward
(``output_hidden_states=True``, logits); :mod:`lens.capturing.fidelity` measures the record, this
module reads and describes it. A record holds, per site kind, the largest relative difference between
what the store keeps and what Hugging Face computes (or why the kind could not be checked), the last
layer's logit lens against the model's logits (and the share of tokens whose top-1 token agrees), the
padding invariance the model card recorded, the dtype, attention and backend that ran, the tolerance
used, and the verdict: ``ok``, ``silently-wrong`` (a capture then ends with exit 2, unless it was
told to keep the store anyway: ``accepted``), or ``not-checked`` (nothing could be compared, with why).

Relative difference: per token, ``||captured - reference||₂`` over the largest ``||·||₂`` of that token's
reference and the terms it was computed from (``resid_pre + attn_out``: both); the largest over the
probe's tokens and the kind's layers. Per token, so that a few huge states (attention sinks, massive
activations) do not make a wrong tensor look close. Values are kept to 3 significant digits.

A store written before records existed has no ``fidelity`` field: every reader says "not recorded".
JSON only (the manifest's own format).

A record is read strictly (:func:`parse_record`): every field of its type (a number written as a string is
a damaged store, refused by the manifest's schema, so ``store info``, ``store verify`` and every study exit
2 alike). It is judged by the tolerance documented for the model's dtype (:data:`TOLERANCES`), never by the
``tolerance`` the file carries: a line past the documented tolerance is past it whatever the file says,
and a record whose lines are past it while its verdict reads ``ok`` (or ``not-checked``) was altered after
its capture — refused as damaged too (:func:`judge`).

A merged store (``lens store merge``) keeps every part's record in ``parts`` (each with its ``part``,
``"2/3"``); the record itself is the worst of them (``silently-wrong`` before ``not-checked`` before
``ok``; among equals, the first part's), so ``store info``, every result, the explorer and the findings
show the worst part. A merged record that reads better than one of its parts is refused as damaged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

from lens.errors import StoreCorruptError

FIDELITY = "fidelity"  # the manifest field
RECORD_VERSION = 1
OK, SILENTLY_WRONG, NOT_CHECKED = "ok", "silently-wrong", "not-checked"
VERDICTS = (OK, SILENTLY_WRONG, NOT_CHECKED)
NOT_RECORDED = "not recorded (the store was captured before stores kept a fidelity record)"
SEVERITY = {OK: 0, NOT_CHECKED: 1, SILENTLY_WRONG: 2}  # the worst verdict of a merged store's parts is its own

# The documented tolerance of the fidelity check (relative, per token) for a model running in each dtype; the
# capture measures against it (lens.capturing.fidelity.tolerance_for) and every reader judges a record by it.
# float32: the bound at which tests/lens/families.py finds every float32 family equal to Hugging Face (ATOL 1e-5;
# measured differences are 0 for the native backend and below 1e-6 for the others). 16-bit models: four units of
# the dtype's rounding (machine epsilon), since an identity recomputed in float32 from 16-bit operands differs from
# the model's own 16-bit sum by up to half a unit per element, and other backends' kernels reorder sums.
FLOAT32_TOLERANCE = 1e-5
HALF_ULPS = 4
TOLERANCES = {"float32": FLOAT32_TOLERANCE, "float64": FLOAT32_TOLERANCE,
              "float16": HALF_ULPS * 2.0 ** -10, "bfloat16": HALF_ULPS * 2.0 ** -7}  # 0.00391, 0.03125


def documented_tolerance(model_dtype: str) -> float:
    """The documented tolerance for a model running in ``model_dtype`` ("float32", "bfloat16", ...);
    ValueError for a dtype without one."""
    try:
        return TOLERANCES[model_dtype]
    except (KeyError, TypeError):
        raise ValueError(f"model_dtype must be one of {', '.join(TOLERANCES)} (a dtype with a documented "
                         f"tolerance), found {model_dtype!r}") from None


def significant(x: float | None, digits: int = 3) -> float | None:
    """``x`` to ``digits`` significant digits (None stays None): what the record keeps and compares."""
    if x is None:
        return None
    return float(f"{float(x):.{digits - 1}e}")


@dataclass(frozen=True)
class SiteCheck:
    """One site kind: compared with ``against`` at ``layers`` layers, the largest relative difference
    ``max_rel`` at ``layer`` (None for single-position sites); ``failed`` when it is past the tolerance
    (or not finite, or of another shape: ``max_rel`` None then). ``why_not``: why it was not checked."""

    site: str
    against: str = ""
    max_rel: float | None = None
    layer: int | None = None
    layers: int = 0
    failed: bool = False
    why_not: str = ""

    @property
    def checked(self) -> bool:
        return self.layers > 0


@dataclass(frozen=True)
class LensCheck:
    """The logit lens of the last layer's ``resid_post`` (the model's own final norm and unembedding)
    against the model's logits: largest absolute and relative (per token) differences, and the share of
    tokens whose top-1 token is the same. ``why_not``: why there is none (an encoder without an LM head)."""

    max_abs: float | None = None
    max_rel: float | None = None
    top1_agreement: float | None = None
    failed: bool = False
    why_not: str = ""

    @property
    def checked(self) -> bool:
        return not self.why_not


@dataclass(frozen=True)
class FidelityRecord:
    """What the capture's fidelity check measured (see the module docstring)."""

    verdict: str
    tolerance: float
    model_dtype: str
    attn: str
    backend: str
    windows: int = 0  # the probe batch: windows and real tokens compared
    tokens: int = 0
    hidden_states: str = ""  # how Hugging Face's hidden_states were read (the family's convention)
    sites: tuple[SiteCheck, ...] = ()
    lens: LensCheck = field(default_factory=LensCheck)
    padding_invariant: bool | None = None  # as the model card recorded it (the architecture probe)
    padding_max_rel: float | None = None
    failure: str = ""  # the one line naming the worst check past the tolerance (verdict silently-wrong)
    accepted: bool = False  # silently wrong, kept anyway (lens capture --allow-silently-wrong)
    why_not: str = ""  # verdict not-checked: why
    version: int = RECORD_VERSION
    part: str = ""  # in a merged store: the part ("2/3") whose check this is
    parts: tuple["FidelityRecord", ...] = ()  # a merged store: every part's record, in part order

    def to_dict(self) -> dict:
        out = asdict(self)
        out["sites"] = [asdict(s) for s in self.sites]
        out["parts"] = [p.to_dict() for p in self.parts]
        return out

    @classmethod
    def from_dict(cls, data) -> "FidelityRecord":
        """The record ``data`` holds, every field checked for its type (:func:`parse_record`)."""
        return parse_record(data)

    def site(self, name: str) -> SiteCheck | None:
        return next((s for s in self.sites if s.site == name), None)


# ------------------------------------------------------------------------------------------- reading, strictly
_STR, _BOOL, _INT, _NUM = "a string", "true or false", "an integer", "a number"


def _shown(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def _typed(data: dict, key: str, kind: str, where: str, default, optional: bool = False):
    """``data[key]`` (``default`` when absent) if it is of ``kind`` (None allowed when ``optional``)."""
    if key not in data:
        return default
    v = data[key]
    if v is None and optional:
        return None
    ok = {_STR: isinstance(v, str), _BOOL: isinstance(v, bool),
          _INT: isinstance(v, int) and not isinstance(v, bool),
          _NUM: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}[kind]
    if not ok:
        raise ValueError(f"{where}{key} must be {kind}{' or null' if optional else ''}, found {_shown(v)}")
    return float(v) if kind == _NUM else v


def _read(cls, data, where: str, required=(), **special):
    """An instance of the record dataclass ``cls`` from the JSON object ``data``: each field typed as its
    annotation says (unknown keys ignored: a later version's additions); ``special``: field -> parser."""
    if not isinstance(data, dict):
        raise ValueError(f"{where.rstrip('.') or 'the record'} must be an object, found {_shown(data)}")
    for key in required:
        if key not in data:
            raise ValueError(f"field {where}{key} is missing")
    kw = {}
    for f in fields(cls):
        if f.name in special:
            if f.name in data:
                kw[f.name] = special[f.name](data[f.name])
            continue
        ann = str(f.type).replace(" ", "")
        kind = {"str": _STR, "bool": _BOOL, "int": _INT}.get(ann.split("|")[0], _NUM)
        default = f.default if f.default is not dataclasses.MISSING else None
        v = _typed(data, f.name, kind, where, default, optional="None" in ann)
        if f.name in data or f.default is not dataclasses.MISSING:
            kw[f.name] = v
    return cls(**kw)


def _list_of(read, where: str):
    def parse(value):
        if not isinstance(value, list):
            raise ValueError(f"{where} must be a list, found {_shown(value)}")
        return tuple(read(v, f"{where}[{i}].") for i, v in enumerate(value))
    return parse


def parse_record(data, where: str = "fidelity.", nested: bool = False) -> FidelityRecord:
    """The record ``data`` holds (a manifest's ``fidelity`` object), every field of its type; ValueError
    naming the field otherwise (a number written as a string, a verdict that is none of the three)."""
    if isinstance(data, dict) and data.get("verdict") not in VERDICTS:
        raise ValueError(f"{where}verdict must be one of {', '.join(VERDICTS)}, found {_shown(data.get('verdict'))}")

    def parts(value):
        if nested and value != []:
            raise ValueError(f"{where}parts: a part's record holds no parts of its own")
        return _list_of(lambda d, w: parse_record(d, w, nested=True), f"{where}parts")(value)

    record = _read(FidelityRecord, data, where, required=("verdict", "tolerance", "model_dtype", "attn", "backend"),
                   sites=_list_of(lambda d, w: _read(SiteCheck, d, w, required=("site",)), f"{where}sites"),
                   lens=lambda d: _read(LensCheck, d, f"{where}lens."), parts=parts)
    if record.tolerance <= 0:
        raise ValueError(f"{where}tolerance must be positive, found {record.tolerance}")
    return record


# -------------------------------------------------------------------------------------------------- judging
def _past(max_rel: float | None, tol: float) -> bool:
    return max_rel is None or max_rel > tol


def judge(record: FidelityRecord, where: str = "fidelity.") -> FidelityRecord:
    """``record`` judged by the documented tolerance of its model's dtype (not the one in the file): each
    site's and the lens's ``failed`` set where the measured difference is past it, ``tolerance`` the
    documented one, each part of a merged record judged alike. ValueError where the record contradicts its
    own lines — its verdict reads better than a line past the tolerance, or better than one of its parts:
    a record altered after its capture (the capture itself never writes one)."""
    tol = documented_tolerance(record.model_dtype)
    sites = tuple(dataclasses.replace(s, failed=s.failed or (s.checked and _past(s.max_rel, tol)))
                  for s in record.sites)
    lens = record.lens
    # a lens check that ran non-finite is failed with no number; one that did not run has neither
    lens = dataclasses.replace(lens, failed=lens.failed or (lens.max_rel is not None and lens.max_rel > tol))
    parts = tuple(judge(p, f"{where}parts[{i}].") for i, p in enumerate(record.parts))
    judged = dataclasses.replace(record, tolerance=tol, sites=sites, lens=lens, parts=parts)
    if record.verdict != SILENTLY_WRONG:
        past = [s for s in sites if s.failed]
        if past or lens.failed:
            said = ("" if record.tolerance == tol else f" (the record names tolerance {record.tolerance:g}, "
                    f"not the documented one)")
            what = (f"{past[0].site} differs from Hugging Face by {_fmt(past[0].max_rel)}" if past else
                    f"the last layer's lens differs from the logits by {_fmt(lens.max_rel)}")
            raise ValueError(f"{where}verdict reads {record.verdict!r}, but {what}, past the documented tolerance "
                             f"{tol:g} for {record.model_dtype} models{said}: the record was altered after its capture")
    if parts:
        worst = max(parts, key=lambda p: SEVERITY[p.verdict])
        if SEVERITY[worst.verdict] > SEVERITY[record.verdict]:
            raise ValueError(f"{where}verdict reads {record.verdict!r}, but part {worst.part or '?'} of the merged "
                             f"store reads {worst.verdict!r}: a merged store's record is its worst part's")
    return judged


def merged_record(parts: list[tuple[str, dict | None]]) -> dict | None:
    """The record of a store merged from ``parts`` — ``(label "2/3", the part's manifest record or None)`` in
    part order — as JSON: the worst part's record (the first part's among equals), marked with its part,
    holding every part's record in ``parts``. None when no part recorded one; a part without a record (a part
    captured before records existed) counts as not checked."""
    if all(data is None for _, data in parts):
        return None
    records = []
    for label, data in parts:
        if data is None:
            records.append(FidelityRecord(verdict=NOT_CHECKED, tolerance=FLOAT32_TOLERANCE, model_dtype="float32",
                                          attn="", backend="", part=label,
                                          why_not=f"part {label} was captured before stores kept a fidelity record"))
        else:
            records.append(dataclasses.replace(judge(parse_record(data)), part=label, parts=()))
    worst = max(records, key=lambda r: SEVERITY[r.verdict])  # max keeps the first of equals
    return dataclasses.replace(worst, parts=tuple(records)).to_dict()


def check_record(data) -> FidelityRecord:
    """:func:`parse_record` then :func:`judge` (ValueError naming what is wrong): the manifest's schema
    refuses a store whose record fails either."""
    return judge(parse_record(data))


def record_of(manifest: Mapping, where="the store") -> FidelityRecord | None:
    """The manifest's fidelity record, judged by the documented tolerance; None for a store written before
    records existed. A malformed or self-contradicting record: :class:`StoreCorruptError` (exit 2)."""
    data = manifest.get(FIDELITY)
    if data is None:
        return None
    try:
        return check_record(data)
    except (ValueError, TypeError) as exc:
        raise StoreCorruptError(f"{where}: its fidelity record is malformed ({exc})") from None


def _fmt(x: float | None) -> str:
    return "inf" if x is None else f"{x:.3g}"



OWN_HOOK = "the workbench's own "  # an import's site compared with the native capture's hook, not Hugging Face's


def own_hook(site: str) -> str:
    """``SiteCheck.against`` of an imported site compared with the workbench's own (native) hook of it."""
    return f"{OWN_HOOK}{site} hook (native capture)"


def is_own_hook(against: str) -> bool:
    return against.startswith(OWN_HOOK)


def verdict_line(record: FidelityRecord | None) -> str:
    """One line: the verdict and what it rests on."""
    if record is None:
        return NOT_RECORDED
    if record.verdict == NOT_CHECKED:
        merged = (f" (part {record.part}, the worst of {len(record.parts)} parts)" if record.parts else "")
        return f"not checked: {record.why_not}{merged}"
    ran = f"{record.model_dtype}, {record.attn} attention, {record.backend} backend"
    if record.parts:  # a merged store: the worst part's check
        ran += (f"; part {record.part}, the worst of {len(record.parts)} parts" if record.verdict != OK
                else f"; all {len(record.parts)} parts ok")
    if record.verdict == SILENTLY_WRONG:
        kept = " — KEPT ANYWAY (--allow-silently-wrong)" if record.accepted else ""
        return f"SILENTLY WRONG{kept}: {record.failure or 'a check is past the tolerance'} ({ran})"
    against = {is_own_hook(s.against) for s in record.sites if s.checked}
    whom = " and ".join(w for own, w in ((False, "Hugging Face"), (True, "the workbench's own hooks"))
                        if own in against) or "Hugging Face"
    return f"ok: within {record.tolerance:g} of {whom} on {record.tokens} tokens of {record.windows} windows ({ran})"


def site_line(s: SiteCheck) -> str:
    if not s.checked:
        return f"{s.site}: not checkable — {s.why_not}"
    n = f"{s.layers} layer{'s' if s.layers != 1 else ''}"
    where = "" if s.layer is None else f" over {n}" if s.max_rel == 0 else f" at layer {s.layer} (of {n})"
    mark = "  PAST TOLERANCE" if s.failed else ""
    return f"{s.site}: max rel {_fmt(s.max_rel)}{where} vs {s.against}{mark}"


def lens_line(lens: LensCheck) -> str:
    if not lens.checked:
        return f"last-layer lens vs logits: n/a — {lens.why_not}"
    mark = "  PAST TOLERANCE" if lens.failed else ""
    top1 = "n/a" if lens.top1_agreement is None else f"{lens.top1_agreement:.1%}"
    return (f"last-layer lens vs logits: max abs {_fmt(lens.max_abs)}, max rel {_fmt(lens.max_rel)}, "
            f"top-1 agreement {top1}{mark}")


def padding_line(record: FidelityRecord) -> str:
    if record.padding_invariant is None:
        return "padding invariance: not checked by the architecture probe (windows batched with padding)"
    rel = "" if record.padding_max_rel is None else f" (max rel {record.padding_max_rel:.2g})"
    if record.padding_invariant:
        return f"padding invariance: yes{rel}"
    return f"padding invariance: no{rel}: windows were captured without padding"


def describe(manifest: dict) -> list[str]:
    """The record as lines for ``lens store info``, the explorer and the report: the verdict first."""
    record = record_of(manifest)
    lines = [verdict_line(record)]
    if record is not None:
        lines += [f"part {p.part}: {verdict_line(p)}" for p in record.parts]
    if record is None or record.verdict == NOT_CHECKED and not record.sites:
        return lines
    lines.append(f"tolerance {record.tolerance:g} (relative, per token; documented for {record.model_dtype}); "
                 f"Hugging Face hidden states read as: {record.hidden_states or 'not returned'}")
    lines += [site_line(s) for s in record.sites]
    lines.append(lens_line(record.lens))
    lines.append(padding_line(record))
    return lines


def worst_record(manifests) -> FidelityRecord | None:
    """The worst judged record of several stores' manifests (a study's store and its controls); None when
    none recorded one."""
    records = [r for r in (record_of(m) for m in manifests) if r is not None]
    return max(records, key=lambda r: SEVERITY[r.verdict], default=None)


__all__ = ["FIDELITY", "FidelityRecord", "SiteCheck", "LensCheck", "record_of", "describe", "verdict_line",
           "own_hook", "is_own_hook", "OK", "SILENTLY_WRONG", "NOT_CHECKED", "NOT_RECORDED", "significant", "TOLERANCES",
           "documented_tolerance", "parse_record", "judge", "check_record", "merged_record", "worst_record"]
