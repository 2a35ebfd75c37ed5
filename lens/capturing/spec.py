"""The capture spec: everything a capture takes, with its defaults, written once.

:class:`CaptureSpec` names which model runs over which text, how the text is cut and batched, what is
kept and how it is stored. Its settings of the model, the text and the store are the fields of the three
parts in :mod:`lens.capturing.settings` (their defaults and help are there, said once; ``CaptureSpec.of(parts)``
builds a spec of them and ``spec.model_settings`` / ``spec.text`` / ``spec.store_settings`` give them back).
:func:`lens.capture` builds one from its keywords (or takes ``spec=``); :func:`lens.collect_stats` /
:func:`lens.collect_positions` read their defaults from :data:`CAPTURE_DEFAULTS`. What a run does
with a spec — where it writes (``out``), whether it continues (``resume``), which part of the plan it
captures (``part``), whether it shows a progress bar — is not part of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lens.capturing.settings import (LOAD_DEVICE, ModelSettings, StoreSettings, TextSettings,  # noqa: F401
                                     parse_sites, setting_field)
from lens.sites import Site


@dataclass(frozen=True)
class CaptureSpec:
    """How a store is captured: the three parts' settings (:mod:`lens.capturing.settings`, whose fields give their
    defaults and help: ``model_settings``, ``text``, ``store_settings`` give them back as parts) and the capture's
    own (device, backend, pipeline, checks), held flat so that ``spec.corpus``, ``spec.replace(max_tokens=...)``
    and a manifest's settings read as they always did. Every default is said once, in its part or here."""

    # the model (ModelSettings.name): anything lens.load_model takes (alias, Hugging Face id, folder, .gguf file,
    # a LoadedModel)
    model: Any = setting_field(ModelSettings, "name")
    # the text (TextSettings.corpus): a built-in corpus name, a .txt / .jsonl path, a list of strings or a Corpus
    corpus: Any = setting_field(TextSettings, "corpus")
    # hook sites captured, every one at each of `layers`: given as Sites or their names (a list, or one comma
    # string "resid_post,attn_out"), held as a tuple of Site
    sites: Sequence[Site | str] | str = setting_field(StoreSettings, "sites")  # a tuple[Site, ...] once built
    # "all", an int, a list, "0,3,5" or "2-6" (lens.sites.expand_sites)
    layers: Any = setting_field(StoreSettings, "layers")
    # tokens of the corpus captured at most (None: all of it)
    max_tokens: int | None = setting_field(TextSettings, "max_tokens")
    # which tokens a corpus larger than max_tokens gives (lens.text.corpora.make_windows): "spread", whole
    # windows from every document in turn, or "first", the documents in order until max_tokens
    sample: str = setting_field(TextSettings, "sample")
    # the seed of a spread sample's random order of documents and windows
    sample_seed: int = setting_field(TextSettings, "sample_seed")
    # the window: tokens per sequence the corpus is cut into
    seq_len: int = setting_field(TextSettings, "seq_len")
    # windows per forward pass
    batch_size: int = setting_field(TextSettings, "batch_size")
    # the stored arrays' dtype: float32, float16 or bfloat16 (not the model's: that is model_dtype)
    dtype: str = setting_field(StoreSettings, "dtype")
    # the dtype of the model's weights and forward pass where a model named by `model` is loaded by the studies,
    # the main job and the command line (ModelSettings.dtype; "auto": bfloat16 on CUDA, float32 on a CPU,
    # resolved by ModelSettings.resolve). lens.capture is given a loaded model (or loads a name with
    # lens.load_model's defaults) and records the dtype it ran in
    model_dtype: str = setting_field(ModelSettings, "dtype")
    # the model's attention implementation where it is loaded from its name: "eager" or "sdpa" (as model_dtype)
    attn: str = setting_field(ModelSettings, "attn")
    # where the model runs: None = where it is (a model loaded from its name: LOAD_DEVICE)
    device: str | None = setting_field(ModelSettings, "device", default=None)
    # where an in-memory store (out=None) holds its arrays: None = the model's device
    store_device: str | None = None
    # how states are read: "native" (forward hooks), "transformer-lens" or "nnsight"
    backend: str = "native"
    # nnsight backend: True runs on NDIF, "local" is nnsight's dry run of a remote request, False runs here
    remote: bool | str = False
    # tokens per shard on disk, rounded to whole batches (lens.capturing.spec.CaptureSpec.shard_windows)
    shard_tokens: int = setting_field(StoreSettings, "shard_tokens")
    # a lens.text.transforms transform ("shuffle", "truncate:64", ...) applied to the text; None: the text as is
    transform: Any = setting_field(TextSettings, "transform")
    # positions of each window kept: "all", "last", "every:K", "first:K" or a list such as 0,5,-1
    positions: Any = setting_field(StoreSettings, "positions")
    # overlap batching, device->host copies and shard writes with the forward pass (the same bytes either way)
    pipeline: bool = True
    # refuse a capture whose estimated store is larger than the free space where it is written
    check_space: bool = True

    def __post_init__(self):
        object.__setattr__(self, "sites", parse_sites(self.sites))

    @classmethod
    def of(cls, model: ModelSettings | None = None, text: TextSettings | None = None,
           store: StoreSettings | None = None, **capture) -> "CaptureSpec":
        """A spec built from the parts (each left out: its defaults) and the capture's own fields (``backend``,
        ``pipeline``, ...); the model part's device is where the model runs."""
        model, text, store = model or ModelSettings(), text or TextSettings(), store or StoreSettings()
        flat = {"model": model.name, "model_dtype": model.dtype, "attn": model.attn, "device": model.device,
                **_values(text), **_values(store)}
        return cls(**{**flat, **capture})

    @property
    def model_settings(self) -> ModelSettings:
        """The model part (a device of None, "where the model is", reads as LOAD_DEVICE)."""
        return ModelSettings(name=self.model, dtype=self.model_dtype, attn=self.attn,
                             device=self.device if self.device is not None else LOAD_DEVICE)

    @property
    def text(self) -> TextSettings:
        return TextSettings(**{k: getattr(self, k) for k in _names(TextSettings)})

    @property
    def store_settings(self) -> StoreSettings:
        return StoreSettings(**{k: getattr(self, k) for k in _names(StoreSettings)})

    @property
    def shard_windows(self) -> int:
        """Windows per shard: ``shard_tokens`` in whole batches of ``batch_size`` windows (at least one)."""
        return max(1, round(self.shard_tokens / self.seq_len / self.batch_size)) * self.batch_size

    def replace(self, **changes) -> "CaptureSpec":
        return dataclasses.replace(self, **changes)


CAPTURE_DEFAULTS = CaptureSpec()


def _names(part: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(part))


def _values(part) -> dict:
    return {k: getattr(part, k) for k in _names(type(part))}


def field_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(CaptureSpec))


def spec_from(spec: CaptureSpec | None, given: dict, what: str = "capture") -> CaptureSpec:
    """``spec``, or one built from keyword values ``given`` (field name -> value). A function that takes
    both (``capture(model, spec=...)``) refuses keywords that differ from their defaults beside a spec: the
    settings are in one or the other, never split between them."""
    if spec is None:
        return CaptureSpec(**given)
    if not isinstance(spec, CaptureSpec):
        raise TypeError(f"{what}: spec must be a CaptureSpec, got {type(spec).__name__}")
    also = [k for k, v in given.items() if not _same(v, getattr(CAPTURE_DEFAULTS, k))]
    if also:
        raise TypeError(f"{what}: pass the capture settings either in spec= or as keywords, not both "
                        f"(got spec= and {', '.join(also)})")
    return spec


def _same(a, b) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # noqa: BLE001 - values whose == is not a plain bool (arrays): not the default
        return False
