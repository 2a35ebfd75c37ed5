"""Study configs: the fields every study has, parsing them from the command line, and resolving the
choices that depend on the model (read from its typed card, never from a family name)."""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass

from lens.capturing.settings import ModelSettings, StoreSettings, TextSettings, setting_field
from lens.capturing.spec import CaptureSpec
from lens.errors import LensInputError
from lens.sites import DEFAULT_SITE, Site
from studies.core.precision import renamed_params


@dataclass(frozen=True)
class StudyConfig:
    """Fields every study has. Studies subclass this with their own (all with defaults).

    ``store``: folder of an activation store to reuse; captured there first if it does not exist.
    ``model`` / ``corpus`` / ``max_tokens`` / ``seq_len`` / ``batch_size`` / ``dtype``: how that store is
    captured — settings of the parts in :mod:`lens.capturing.settings`, whose defaults and help they take
    (:meth:`capture_spec` is the spec a study's store is captured with; ``dtype``: the stored arrays'). They are
    held flat, so that ``--param model_dtype=...``, ``dataclasses.replace(config, max_tokens=...)`` and the
    ``config`` a result records read as before; :attr:`model_settings` and :attr:`text` are the parts.
    ``model_dtype``: the dtype the model is loaded and run in (``lens.model.loading.MODEL_DTYPES``; "auto" =
    bfloat16 on CUDA, float32 on a CPU, resolved by ``config.model_settings.resolve()`` in
    :func:`with_model_settings` before a study runs);
    ``attn``: its attention implementation ("eager" or "sdpa"). A store captured with another model
    dtype or attention does not serve the study. ``device``: where the model is loaded and runs.
    ``sample`` / ``sample_seed``: which tokens of a corpus larger than ``max_tokens`` the store holds
    (``spread``: whole windows from every document; ``first``: the first ``max_tokens``), as the capture's.
    ``target_half_width``: the precision ``--precision`` asked of the study's headline (0: its declared one;
    :mod:`studies.core.precision`), recorded with the half-width reached in ``result.json``'s ``extra["precision"]``.
    """

    # the capture settings: each field's default and help are its part's (lens.capturing.settings), said there
    model: str = setting_field(ModelSettings, "name")
    corpus: str = setting_field(TextSettings, "corpus")
    max_tokens: int = setting_field(TextSettings, "max_tokens")
    seq_len: int = setting_field(TextSettings, "seq_len")
    batch_size: int = setting_field(TextSettings, "batch_size")
    device: str = setting_field(ModelSettings, "device")
    store: str | None = None
    seed: int = 0
    progress: bool = True
    dtype: str = setting_field(StoreSettings, "dtype")
    model_dtype: str = setting_field(ModelSettings, "dtype")
    attn: str = setting_field(ModelSettings, "attn")
    sample: str = setting_field(TextSettings, "sample")
    sample_seed: int = setting_field(TextSettings, "sample_seed")
    target_half_width: float = 0.0

    @property
    def model_settings(self) -> ModelSettings:
        """The model part: name, dtype, attention, device (``.resolve()``: the plan, "auto" made concrete)."""
        return ModelSettings(name=self.model, dtype=self.model_dtype, attn=self.attn, device=self.device)

    @property
    def text(self) -> TextSettings:
        """The text part: corpus, max tokens, window, batch, sample (a study's own store reads its text as is)."""
        return TextSettings(corpus=self.corpus, max_tokens=self.max_tokens, seq_len=self.seq_len,
                            batch_size=self.batch_size, sample=self.sample, sample_seed=self.sample_seed)

    def store_settings_for(self, sites) -> StoreSettings:
        """The store part a study's store of ``sites`` is captured with: every layer, every position."""
        return StoreSettings(sites=tuple(sites), layers="all", dtype=self.dtype)

    def capture_spec(self, sites, **more) -> CaptureSpec:
        """How a store of ``sites`` (every layer) is captured for this config; ``more``: other
        :class:`lens.capturing.spec.CaptureSpec` fields (a control's ``transform``, ``positions``)."""
        return CaptureSpec.of(self.model_settings, self.text, self.store_settings_for(sites), **more)


@dataclass(frozen=True)
class SiteConfig(StudyConfig):
    """The config of a study that reads one site of the store (at every layer): ``site``, by default the
    residual stream after each block (:data:`lens.sites.DEFAULT_SITE`)."""

    site: Site = DEFAULT_SITE

    def __post_init__(self):
        site = Site.parse(self.site)  # a name given in Python ("resid_mid") is the Site it names
        if not site.per_layer:
            raise LensInputError(f"site: expected a site with a state at every layer, got {site.value!r} "
                                 "(one state per token)")
        object.__setattr__(self, "site", site)


#: the window positions every geometry study leaves out unless told (``skip_first``): position 0 holds the attention
#: sink, whose massive activations (a few channels hundreds of times the median: the anisotropy study's sink table)
#: dominate cosine-based geometry
SKIP_FIRST_DEFAULT = 1


@dataclass(frozen=True)
class TokenFilterConfig(SiteConfig):
    """The token filter every geometry study shares (anisotropy, intrinsic dimension, linearity): ``skip_first``
    — leave out the first K positions of every window (default :data:`SKIP_FIRST_DEFAULT`: the sink at position 0;
    0 keeps every position) — and ``drop_special`` — leave out special tokens (BOS/CLS/SEP). A study whose paper
    scores every token says so by its own defaults (linearity: 0 and False). :meth:`token_filter` is what a result
    records (``extra["token_filter"]``)."""

    skip_first: int = SKIP_FIRST_DEFAULT
    drop_special: bool = True

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.skip_first, bool) or not isinstance(self.skip_first, int) or self.skip_first < 0:
            raise LensInputError(f"skip_first: expected a number of positions >= 0, got {self.skip_first!r}")

    def token_mask(self, store):
        """The store rows the filter keeps (``store.mask(drop_special, skip_first)``)."""
        return store.mask(self.drop_special, self.skip_first)

    def token_filter(self) -> str:
        """The filter in words, as a result records it."""
        first = ("every position kept" if not self.skip_first else
                 f"window positions 0..{self.skip_first - 1} left out" if self.skip_first > 1
                 else "window position 0 (the attention sink) left out")
        return (f"skip_first={self.skip_first}: {first}; drop_special={self.drop_special}: special tokens "
                f"{'left out' if self.drop_special else 'kept'} (default skip_first={SKIP_FIRST_DEFAULT})")


def with_model_settings(config):
    """``config`` with its model settings resolved (:meth:`lens.capturing.settings.ModelSettings.resolve`:
    "auto" -> what runs on ``config.device``; the attention and the device checked), so that its result records
    the dtype that ran."""
    resolved = config.model_settings.resolve().dtype
    return config if resolved == config.model_dtype else dataclasses.replace(config, model_dtype=resolved)


def field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def config_from_dict(cls, values: dict):
    """Build a frozen config from strings (command line) or values, converting by field type; an old name
    of the sample-size knob is read as ``sample_tokens``, with a warning (:func:`studies.core.precision.renamed_params`)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = renamed_params(values, fields)
    kwargs = {}
    for key, raw in values.items():
        name = key.replace("-", "_")
        if name not in fields:
            raise LensInputError(f"{cls.__module__} has no parameter {key!r} (has {', '.join(fields)})")
        kwargs[name] = _convert(fields[name], raw)
    return cls(**kwargs)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _convert(field, raw):
    """A command-line string as the field's type; a value that is not one (a bool that is neither
    true nor false, a non-finite number) is refused naming the field."""
    if not isinstance(raw, str):
        return raw
    default = field.default
    kind = type(default) if default is not None and default is not dataclasses.MISSING else None
    ann = str(field.type)
    if raw.strip().lower() == "none" and "None" in ann:
        return None
    if kind is not None and issubclass(kind, enum.Enum):  # a site: Site.parse refuses an unknown one by name
        return kind.parse(raw) if hasattr(kind, "parse") else kind(raw)
    try:
        if kind is bool or ann == "bool":
            if raw.strip().lower() in _TRUE + _FALSE:
                return raw.strip().lower() in _TRUE
            raise ValueError(raw)
        if kind is int or ann.startswith("int"):
            return int(raw)
        if kind is float or ann.startswith("float"):
            value = float(raw)
            if not math.isfinite(value):  # inf, nan, 1e999: no study means these (JSON would record null)
                raise LensInputError(f"parameter {field.name}: expected a finite number, got {raw!r}")
            return value
        if kind is tuple or ann.startswith("tuple"):
            return tuple(x.strip() for x in raw.split(",") if x.strip())
    except LensInputError:
        raise
    except ValueError:
        want = "true or false" if kind is bool or ann == "bool" else (kind.__name__ if kind else ann)
        raise LensInputError(f"parameter {field.name}: expected {want}, got {raw!r}") from None
    return raw


def require_budget(study: str, name: str, value: int | None) -> None:
    """A token budget (0 = every token) must not be negative."""
    if value is not None and value < 0:
        raise LensInputError(f"{study}: {name} must be >= 0 (0 = all tokens); got {value}")


NORM_CHOICES = ("auto", "rms", "layer", "none")


def resolve_norm(choice: str, card) -> tuple[str | None, str]:
    """The fresh, weight-free norm a probe puts in front of its readout, and how it was chosen.

    He & Su (2024) pass every layer's states through a newly initialised copy of the model's final
    norm, so "auto" takes the kind of the model's own final norm from its card (``card.norm_kind``).
    A model without a final norm (post-norm encoders: every block ends in its own LayerNorm) falls
    back to LayerNorm, the norm its blocks end in; the second value says so, for the result.
    """
    if choice == "auto":
        if card.norm_kind is None:
            return "layer", (f"layer: fallback, {card.model_id} has no final norm "
                             f"({card.block.value} blocks end in their own LayerNorm)")
        return card.norm_kind.value, f"{card.norm_kind.value}: the model's final norm (model card)"
    if choice in ("rms", "layer"):
        return choice, f"{choice}: configured"
    if choice == "none":
        return None, "none: configured"
    raise LensInputError(f"norm: expected one of {', '.join(NORM_CHOICES)}, got {choice!r}")
