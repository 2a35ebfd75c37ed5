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
JSON only (the manifest's own format); :func:`record_of` refuses a malformed record as a damaged store.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from lens.errors import StoreCorruptError

FIDELITY = "fidelity"  # the manifest field
RECORD_VERSION = 1
OK, SILENTLY_WRONG, NOT_CHECKED = "ok", "silently-wrong", "not-checked"
VERDICTS = (OK, SILENTLY_WRONG, NOT_CHECKED)
NOT_RECORDED = "not recorded (the store was captured before stores kept a fidelity record)"


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

    def to_dict(self) -> dict:
        out = asdict(self)
        out["sites"] = [asdict(s) for s in self.sites]
        return out

    @classmethod
    def from_dict(cls, data) -> "FidelityRecord":
        if not isinstance(data, dict) or data.get("verdict") not in VERDICTS:
            raise ValueError(f"expected an object with a verdict among {', '.join(VERDICTS)}")
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        kw["sites"] = tuple(SiteCheck(**{k: v for k, v in s.items() if k in _SITE_FIELDS})
                            for s in data.get("sites") or ())
        kw["lens"] = LensCheck(**{k: v for k, v in (data.get("lens") or {}).items() if k in _LENS_FIELDS})
        return cls(**kw)

    def site(self, name: str) -> SiteCheck | None:
        return next((s for s in self.sites if s.site == name), None)


_SITE_FIELDS = {f.name for f in fields(SiteCheck)}
_LENS_FIELDS = {f.name for f in fields(LensCheck)}


def record_of(manifest: dict, where="the store") -> FidelityRecord | None:
    """The manifest's fidelity record; None for a store written before records existed."""
    data = manifest.get(FIDELITY)
    if data is None:
        return None
    try:
        return FidelityRecord.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise StoreCorruptError(f"{where}: its fidelity record is malformed ({exc})") from None


def _num(x: float | None) -> str:
    return "inf" if x is None else f"{x:.3g}"


def verdict_line(record: FidelityRecord | None) -> str:
    """One line: the verdict and what it rests on."""
    if record is None:
        return NOT_RECORDED
    if record.verdict == NOT_CHECKED:
        return f"not checked: {record.why_not}"
    ran = f"{record.model_dtype}, {record.attn} attention, {record.backend} backend"
    if record.verdict == SILENTLY_WRONG:
        kept = " — KEPT ANYWAY (--allow-silently-wrong)" if record.accepted else ""
        return f"SILENTLY WRONG{kept}: {record.failure} ({ran})"
    return (f"ok: within {record.tolerance:g} of Hugging Face on {record.tokens} tokens of {record.windows} "
            f"windows ({ran})")


def site_line(s: SiteCheck) -> str:
    if not s.checked:
        return f"{s.site}: not checkable — {s.why_not}"
    n = f"{s.layers} layer{'s' if s.layers != 1 else ''}"
    where = "" if s.layer is None else f" over {n}" if s.max_rel == 0 else f" at layer {s.layer} (of {n})"
    mark = "  PAST TOLERANCE" if s.failed else ""
    return f"{s.site}: max rel {_num(s.max_rel)}{where} vs {s.against}{mark}"


def lens_line(lens: LensCheck) -> str:
    if not lens.checked:
        return f"last-layer lens vs logits: n/a — {lens.why_not}"
    mark = "  PAST TOLERANCE" if lens.failed else ""
    return (f"last-layer lens vs logits: max abs {_num(lens.max_abs)}, max rel {_num(lens.max_rel)}, "
            f"top-1 agreement {lens.top1_agreement:.1%}{mark}")


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
    if record is None or record.verdict == NOT_CHECKED and not record.sites:
        return lines
    lines.append(f"tolerance {record.tolerance:g} (relative, per token; {record.model_dtype}); "
                 f"Hugging Face hidden states read as: {record.hidden_states or 'not returned'}")
    lines += [site_line(s) for s in record.sites]
    lines.append(lens_line(record.lens))
    lines.append(padding_line(record))
    return lines


__all__ = ["FIDELITY", "FidelityRecord", "SiteCheck", "LensCheck", "record_of", "describe", "verdict_line",
           "OK", "SILENTLY_WRONG", "NOT_CHECKED", "NOT_RECORDED", "significant"]
