"""Study configs: the fields every study has, parsing them from the command line, and resolving the
choices that depend on the model (read from its typed card, never from a family name)."""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass

from lens.capturing.settings import HoldsParts, ModelSettings, StoreSettings, TextSettings, flat_property, setting_field
from lens.capturing.spec import CaptureSpec
from lens.errors import LensInputError
from lens.sites import DEFAULT_SITE, Site
from studies.core.precision import renamed_params


#: the capture settings a config holds in its parts, by the flat name ``--param``, notebooks, tests and a result's
#: ``config`` record give them: flat name -> (the config's field that holds it, the part's field (None: the config's
#: field is the setting itself), the type a command-line string converts to)
FLAT_SETTINGS: dict[str, tuple[str, str | None, str]] = {
    "model": ("model_settings", "name", "str"),
    "corpus": ("text", "corpus", "str"),
    "max_tokens": ("text", "max_tokens", "int"),
    "seq_len": ("text", "seq_len", "int"),
    "batch_size": ("text", "batch_size", "int"),
    "device": ("model_settings", "device", "str"),
    "dtype": ("store_dtype", None, "str"),
    "model_dtype": ("model_settings", "dtype", "str"),
    "attn": ("model_settings", "attn", "str"),
    "sample": ("text", "sample", "str"),
    "sample_seed": ("text", "sample_seed", "int"),
}
#: the flat record of the fields every config has, in the order ``result.json``'s ``config`` lists them (the
#: order the fields were declared in when they were held flat); a study's own fields follow
RECORD_ORDER = ("model", "corpus", "max_tokens", "seq_len", "batch_size", "device", "store", "seed", "progress",
                "dtype", "model_dtype", "attn", "sample", "sample_seed", "target_half_width")


@dataclass(frozen=True)
class StudyConfig(metaclass=HoldsParts):
    """Fields every study has. Studies subclass this with their own (all with defaults).

    The capture settings are held in the parts of :mod:`lens.capturing.settings`, said there once:
    ``model_settings`` (:class:`ModelSettings`: the model's name, its dtype — "auto" = bfloat16 on CUDA, float32 on
    a CPU, resolved by ``config.model_settings.resolve()`` in :func:`with_model_settings` before a study runs —,
    its attention and the device it runs on; a store captured with another model dtype or attention does not
    serve the study), ``text`` (:class:`TextSettings`: corpus, max tokens, window, batch, and which tokens of a
    corpus larger than ``max_tokens`` the store holds: ``sample`` / ``sample_seed``) and ``store_dtype`` (the
    stored arrays' dtype, :class:`StoreSettings`' ``dtype``). :meth:`capture_spec` is the spec a study's store is
    captured with.

    Flat names (:data:`FLAT_SETTINGS`) read and build them: ``config.max_tokens`` reads ``config.text.max_tokens``;
    ``Config(model=..., max_tokens=...)``, ``--param model_dtype=...`` and :meth:`with_settings` fold them into
    the parts; :meth:`to_record` is the flat record a result keeps (``result.json``'s ``config``, what
    ``--resume`` matches), :meth:`from_record` reads one back. A subclass that declares a flat name with a default
    (``corpus: str = "wordnet-3.0"``) sets its own default part (:meth:`__init_subclass__`).

    The run's arguments: ``store``: folder of an activation store to reuse; captured there first if it does not
    exist. ``seed``: of every random choice. ``progress``: progress bars. ``target_half_width``: the precision
    ``--precision`` asked of the study's headline (0: its declared one; :mod:`studies.core.precision`), recorded
    with the half-width reached in ``result.json``'s ``extra["precision"]``.
    """

    model_settings: ModelSettings = ModelSettings()
    text: TextSettings = TextSettings()
    store: str | None = None
    seed: int = 0
    progress: bool = True
    store_dtype: str = setting_field(StoreSettings, "dtype")
    target_half_width: float = 0.0

    FLAT = FLAT_SETTINGS  # the flat names HoldsParts folds into the parts (a class attribute, not a field)
    model = flat_property(*FLAT_SETTINGS["model"][:2])
    corpus = flat_property(*FLAT_SETTINGS["corpus"][:2])
    max_tokens = flat_property(*FLAT_SETTINGS["max_tokens"][:2])
    seq_len = flat_property(*FLAT_SETTINGS["seq_len"][:2])
    batch_size = flat_property(*FLAT_SETTINGS["batch_size"][:2])
    device = flat_property(*FLAT_SETTINGS["device"][:2])
    dtype = flat_property(*FLAT_SETTINGS["dtype"][:2])
    model_dtype = flat_property(*FLAT_SETTINGS["model_dtype"][:2])
    attn = flat_property(*FLAT_SETTINGS["attn"][:2])
    sample = flat_property(*FLAT_SETTINGS["sample"][:2])
    sample_seed = flat_property(*FLAT_SETTINGS["sample_seed"][:2])

    def __init_subclass__(cls, **kwargs):
        """A subclass' flat setting with a default (``corpus: str = "wordnet-3.0"``) becomes its default part
        (``text`` = the parent's with that corpus), so that no setting is a field twice."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__annotations__", {})
        changes: dict[str, dict] = {}
        for name in [n for n in own if n in FLAT_SETTINGS]:
            if name not in cls.__dict__:
                raise TypeError(f"{cls.__name__}.{name}: a setting a study declares needs a default")
            holder, key = FLAT_SETTINGS[name][:2]
            changes.setdefault(holder, {})[key or ""] = cls.__dict__[name]
            del own[name]
            delattr(cls, name)
        for holder, values in changes.items():
            parent = next(c.__dataclass_fields__[holder] for c in cls.__mro__[1:]
                          if holder in getattr(c, "__dataclass_fields__", {}))  # the nearest config's part
            default = values[""] if "" in values else dataclasses.replace(parent.default, **values)
            own[holder] = parent.type
            setattr(cls, holder, dataclasses.field(default=default, metadata=parent.metadata))

    def with_settings(self, **changes):
        """This config with some settings (flat names: ``max_tokens=``, ``model_dtype=``; or whole parts) or run
        arguments changed."""
        return dataclasses.replace(self, **changes)

    def to_record(self) -> dict:
        """The flat record a result keeps of this config (``result.json``'s ``config``, matched by ``--resume``):
        :data:`RECORD_ORDER`'s names, then the study's own fields, each with its value."""
        own = [f.name for f in dataclasses.fields(self) if f.name not in _BASE_FIELDS]
        return {name: getattr(self, name) for name in (*RECORD_ORDER, *own)}

    @classmethod
    def from_record(cls, record: dict):
        """The config a flat record (:meth:`to_record`, an older ``result.json``'s ``config``) describes; a list
        where a tuple was recorded is a tuple again."""
        return config_from_dict(cls, {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()})

    def store_settings_for(self, sites) -> StoreSettings:
        """The store part a study's store of ``sites`` is captured with: every layer, every position."""
        return StoreSettings(sites=tuple(sites), layers="all", dtype=self.store_dtype)

    def capture_spec(self, sites, **more) -> CaptureSpec:
        """How a store of ``sites`` (every layer) is captured for this config; ``more``: other
        :class:`lens.capturing.spec.CaptureSpec` fields (a control's ``transform``, ``positions``)."""
        return CaptureSpec.of(self.model_settings, self.text, self.store_settings_for(sites), **more)


_BASE_FIELDS = frozenset(f.name for f in dataclasses.fields(StudyConfig))


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
    return config if resolved == config.model_dtype else config.with_settings(model_dtype=resolved)


def field_names(cls) -> set[str]:
    """The parameters of the config class ``cls``: the flat setting names, the run's arguments and its own fields."""
    return set(param_fields(cls))


@dataclass(frozen=True)
class _Param:
    """A flat setting as :func:`_convert` reads a field: its name, its default in ``cls`` and its type."""

    name: str
    default: object
    type: str


def param_fields(cls) -> dict:
    """Name -> field (or :class:`_Param`) of every parameter of the config class ``cls``, in its record's order."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out = {}
    for name in (*RECORD_ORDER, *(n for n in fields if n not in _BASE_FIELDS)):
        if name in FLAT_SETTINGS:
            holder, key, kind = FLAT_SETTINGS[name]
            part = fields[holder].default
            out[name] = _Param(name, part if key is None else getattr(part, key), kind)
        else:
            out[name] = fields[name]
    return out


def config_from_dict(cls, values: dict):
    """Build a frozen config from strings (command line) or values, converting by field type: flat setting names
    (folded into the parts), the parts themselves, the run's arguments and the study's own fields; an old name
    of the sample-size knob is read as ``sample_tokens``, with a warning (:func:`studies.core.precision.renamed_params`)."""
    fields = param_fields(cls)
    values = renamed_params(values, fields)
    kwargs = {}
    for key, raw in values.items():
        name = key.replace("-", "_")
        if name in _PART_FIELDS:
            kwargs[name] = raw
            continue
        if name not in fields:
            raise LensInputError(f"{cls.__module__} has no parameter {key!r} (has {', '.join(fields)})")
        kwargs[name] = _convert(fields[name], raw)
    return cls(**kwargs)


_PART_FIELDS = frozenset(holder for holder, _, _ in FLAT_SETTINGS.values())  # given whole: as they are


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
