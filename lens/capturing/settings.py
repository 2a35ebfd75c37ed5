"""The capture's settings in three small frozen parts, each field's default, help and command-line flag said once.

In the manner of tuned-lens' ingredients (``tuned_lens/scripts/ingredients.py``): a part is a frozen dataclass
whose fields carry their documentation in ``dataclasses.field(metadata=...)``, and ``resolve()`` turns the
settings a user gave into a plan of another type, checked and concrete:

* :class:`ModelSettings` (name, dtype, attention, device) -> :class:`ModelPlan`. ``resolve()`` is the one place
  a model dtype of ``"auto"`` becomes a dtype (bfloat16 on CUDA, float32 on a CPU; the rule is
  :func:`lens.model.loading.resolve_model_dtype`, which ``lens.load_model`` applies to a dtype given to it);
* :class:`TextSettings` (corpus, max tokens, window, batch, sample, transform) -> :class:`TextPlan`;
* :class:`StoreSettings` (sites, layers, positions, stored dtype, shard size) -> :class:`StorePlan`.

:class:`lens.capturing.spec.CaptureSpec` and :class:`studies.core.config.StudyConfig` hold these parts as their fields
(``spec.text``, ``config.model_settings``, ...) and read and build them by flat names too (``config.max_tokens``,
``CaptureSpec(max_tokens=64)``: :class:`HoldsParts`); the ``lens`` command line's flags are generated from the
metadata (``app.commands.flags.add_setting_flags``).

Cheap to import (no torch): the command line's parsers and the studies' declarations read it. ``resolve()``
imports the checks it applies (lens.model.loading and the text and store parsers, which import torch) when it
runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lens.errors import LensInputError
from lens.model.default import ATTN_IMPLEMENTATIONS, DEFAULT_MODEL, MODEL_DTYPES  # the model's choices: said there
from lens.sites import DEFAULT_SITE, Site

# where a model named by a string is loaded when no device is given (lens.load_model's own default): the
# studies' and the command line's --device
LOAD_DEVICE = "cpu"
SAMPLE_CHOICES = ("spread", "first")
STORE_DTYPE_CHOICES = ("float32", "float16", "bfloat16")


def setting(default: Any, help: str, *, flag: str | None = "", choices: Sequence[str] | None = None,
            kind: str | None = None, metavar: str | None = None) -> Any:
    """A part's field: its ``default`` and, in its metadata, its ``help`` (the docs and ``--help`` say it) and its
    command-line ``flag`` ("" = ``--`` and the field's name with dashes; None = not on the command line),
    ``choices``, and the ``kind`` of value a flag parses ("int"; "device": a device that exists here; "list":
    a comma list; None: a string)."""
    meta = {"help": help, "flag": flag, "choices": tuple(choices) if choices else None, "kind": kind,
            "metavar": metavar}
    return field(default=default, metadata=meta)


def setting_field(part: type, name: str, default: Any = dataclasses.MISSING) -> Any:
    """The field ``name`` of the part ``part`` (its default and metadata), for a type that holds the setting
    flat (StudyConfig's stored dtype): its default and help are the part's, said there once; ``default``
    overrides the default where that type means another (CaptureSpec's device: None, the model stays where it is)."""
    f = part_field(part, name)
    return field(default=f.default if default is dataclasses.MISSING else default, metadata=f.metadata)


def part_field(part: type, name: str) -> dataclasses.Field:
    for f in dataclasses.fields(part):
        if f.name == name:
            return f
    raise AttributeError(f"{part.__name__} has no setting {name!r}")


def flag_name(f: dataclasses.Field) -> str | None:
    """The command-line flag of a part's field (``--max-tokens``), or None where it has none."""
    flag = f.metadata.get("flag", "")
    return None if flag is None else (flag or "--" + f.name.replace("_", "-"))


# --------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class ModelPlan:
    """A model's settings resolved: the dtype it is loaded and runs in (never "auto"), its attention checked,
    the device parsed (it exists here)."""

    name: Any
    dtype: str
    attn: str
    device: str


@dataclass(frozen=True)
class ModelSettings:
    """Which model runs, and how it is loaded: the one place "auto" resolves (:meth:`resolve`)."""

    name: Any = setting(DEFAULT_MODEL, "alias (lens models lists them), Hugging Face id, model folder or .gguf file",
                        flag="--model")
    dtype: str | None = setting("auto", "dtype of the model's weights and forward pass (default auto: bfloat16 on "
                                "CUDA, float32 on CPU); recorded in the store and results",
                                flag="--model-dtype", choices=MODEL_DTYPES)
    attn: str = setting("eager", "the model's attention implementation", choices=ATTN_IMPLEMENTATIONS)
    device: str | None = setting(LOAD_DEVICE, "cpu or cuda", kind="device")  # None: where a loaded model is

    def resolve(self) -> ModelPlan:
        """The plan: ``dtype`` "auto" -> bfloat16 on a CUDA device, float32 on a CPU (None: float32); a dtype or
        attention outside the choices, or a device that does not exist here, is a :class:`LensInputError` in
        one line."""
        from lens.model.loading import check_attn, resolve_model_dtype  # torch: at run time, not at --help
        from lens.runtime.devices import parse_device

        check_attn(self.attn)
        device = parse_device(self.device if self.device is not None else LOAD_DEVICE)
        return ModelPlan(name=self.name, dtype=resolve_model_dtype(self.dtype, device), attn=self.attn, device=device)


# --------------------------------------------------------------------------- the text
@dataclass(frozen=True)
class TextPlan:
    """The text's settings checked: the sample's rule and seed, the transform parsed (a CorpusTransform or None)."""

    corpus: Any
    max_tokens: int | None
    seq_len: int
    batch_size: int
    sample: str
    sample_seed: int
    transform: Any


@dataclass(frozen=True)
class TextSettings:
    """Which text the model reads and how it is cut into windows and batches."""

    corpus: Any = setting("wiki-sample", "wiki-sample, lee, or a .txt / .jsonl file")
    max_tokens: int | None = setting(20_000, "tokens of the corpus to run through the model", kind="int")
    sample: str = setting("spread", "which tokens a corpus larger than --max-tokens gives: spread (whole windows "
                          "drawn from every document in turn) or first (the documents in order until --max-tokens)",
                          choices=SAMPLE_CHOICES)
    sample_seed: int = setting(0, "seed of a spread sample's random order of documents and windows", kind="int")
    seq_len: int = setting(128, "tokens per window (the model reads each window alone)", kind="int")
    batch_size: int = setting(8, "windows per forward pass", kind="int")
    transform: Any = setting(None, "a transform of each document's tokens before they are cut into windows: "
                             "shuffle, truncate:N, remove:CLASS,..., remove-random:CLASS,..., prepend:TEXT "
                             "(lens.text.transforms; recorded in the store; default: the text as it is)")

    def resolve(self) -> TextPlan:
        from lens.text.transforms import parse_transform  # numpy and torch: at run time
        from lens.text.windows import check_sample_seed, parse_sample

        for name in ("seq_len", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LensInputError(f"{name} must be an integer >= 1, got {value!r}")
        return TextPlan(corpus=self.corpus, max_tokens=self.max_tokens, seq_len=self.seq_len,
                        batch_size=self.batch_size, sample=parse_sample(self.sample),
                        sample_seed=check_sample_seed(self.sample_seed), transform=parse_transform(self.transform))


# --------------------------------------------------------------------------- the store
def parse_sites(sites: Sequence[Site | str] | str) -> tuple[Site, ...]:
    """Sites given as Sites or their names (a list, or one comma string "resid_post,attn_out") as a tuple of Site."""
    given = sites.split(",") if isinstance(sites, str) else sites
    return tuple(Site.parse(s) for s in given if not isinstance(s, str) or s.strip())


@dataclass(frozen=True)
class StorePlan:
    """The store's settings checked: sites as Site, positions parsed ("all", "last", ... or a tuple of
    ints), the stored dtype's canonical name."""

    sites: tuple[Site, ...]
    layers: Any
    positions: Any
    dtype: str
    shard_tokens: int


@dataclass(frozen=True)
class StoreSettings:
    """What a store keeps of a capture and how it lays it out."""

    sites: Sequence[Site | str] | str = setting(
        (DEFAULT_SITE,), "comma list: embed,resid_pre,resid_mid,resid_post,attn_out,mlp_out,router_logits,final_norm "
        "(lens inspect MODEL lists a model's)", kind="list")
    layers: Any = setting("all", "all, '0,3,5' or '2-6'")
    dtype: str = setting("float32", "the store's array dtype: float32, float16 or bfloat16 (the model's is "
                         "--model-dtype)")
    shard_tokens: int = setting(16384, "tokens per shard file of the store (a resumed capture goes on from the "
                                "last whole shard)", kind="int")
    positions: Any = setting("all", "keep only these positions of each window: all, last, every:K, first:K or a "
                             "list such as 0,5,-1 (studies that need every position refuse a thinned store)")

    def __post_init__(self):
        object.__setattr__(self, "sites", parse_sites(self.sites))

    def resolve(self) -> StorePlan:
        from lens.store.format import parse_store_dtype  # torch: at run time
        from lens.store.positions import parse_positions

        if isinstance(self.shard_tokens, bool) or not isinstance(self.shard_tokens, int) or self.shard_tokens < 1:
            raise LensInputError(f"shard_tokens must be an integer >= 1, got {self.shard_tokens!r}")
        return StorePlan(sites=parse_sites(self.sites), layers=self.layers, positions=parse_positions(self.positions),
                         dtype=parse_store_dtype(self.dtype), shard_tokens=self.shard_tokens)


PARTS = (ModelSettings, TextSettings, StoreSettings)


# --------------------------------------------------------------------------- a type that holds the parts
class HoldsParts(type):
    """The metaclass of a frozen dataclass that holds the parts as its fields (:class:`lens.capturing.spec.CaptureSpec`,
    :class:`studies.core.config.StudyConfig`) and takes their settings by flat name as well: ``Holder(max_tokens=64)``
    and ``dataclasses.replace(holder, max_tokens=64)`` fold each name of the class' ``FLAT`` table (flat name ->
    (the field that holds the part, the part's field; None: that field is the setting itself)) into its part, over
    the part given with it, else over the class' default part (:func:`fold_flat`), before the dataclass'
    ``__init__`` runs."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return super().__call__(*args, **fold_flat(cls, kwargs))


def fold_flat(cls: Any, values: dict) -> dict:
    """``values`` (keywords of the holder ``cls``) with its flat setting names folded into the parts."""
    table = cls.FLAT
    out = {k: v for k, v in values.items() if k not in table}
    changes: dict[str, dict] = {}
    for name in [n for n in values if n in table]:
        holder, key = table[name][:2]
        if key is None:
            out[holder] = values[name]
        else:
            changes.setdefault(holder, {})[key] = values[name]
    for holder, given in changes.items():
        part = out[holder] if holder in out else cls.__dataclass_fields__[holder].default
        out[holder] = dataclasses.replace(part, **given)
    return out


def flat_property(holder: str, key: str | None) -> Any:
    """The read-only flat name of a setting a holder keeps in its part ``holder`` (``spec.max_tokens`` reads
    ``spec.text.max_tokens``); ``key`` None: the field ``holder`` itself."""
    if key is None:
        return property(lambda self: getattr(self, holder), doc=f"``{holder}``")
    return property(lambda self: getattr(getattr(self, holder), key), doc=f"``{holder}.{key}`` (read-only)")
