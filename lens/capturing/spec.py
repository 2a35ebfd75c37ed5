"""The capture spec: everything a capture takes, with its defaults, written once.

:class:`CaptureSpec` names which model runs over which text, how the text is cut and batched, what is
kept and how it is stored. Its settings of the model, the text and the store are held in the three parts of
:mod:`lens.capturing.settings` (their defaults and help are there, said once): ``spec.model_settings``,
``spec.text``, ``spec.store_settings`` are its fields, ``CaptureSpec.of(parts)`` builds a spec of them and the flat
names (``spec.max_tokens``, ``CaptureSpec(max_tokens=64)``) read and build them too.
:func:`lens.capture` builds one from its keywords (or takes ``spec=``); :func:`lens.collect_stats` /
:func:`lens.collect_positions` read their defaults from :data:`CAPTURE_DEFAULTS`. What a run does
with a spec — where it writes (``out``), whether it continues (``resume``), which part of the plan it
captures (``part``), whether it shows a progress bar — is not part of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lens.capturing.settings import LOAD_DEVICE, HoldsParts, ModelSettings, StoreSettings, TextSettings, flat_property

__all__ = ["CAPTURE_DEFAULTS", "FLAT", "LOAD_DEVICE", "CaptureSpec", "field_names", "spec_from"]


#: the settings a spec holds in its parts, by their flat names (``spec.corpus``, ``CaptureSpec(max_tokens=64)``,
#: ``spec.replace(dtype=...)``, :func:`lens.capture`'s keywords): flat name -> (the part's field, its own field)
FLAT = {
    "model": ("model_settings", "name"), "model_dtype": ("model_settings", "dtype"),
    "attn": ("model_settings", "attn"), "device": ("model_settings", "device"),
    **{f.name: ("text", f.name) for f in dataclasses.fields(TextSettings)},
    **{f.name: ("store_settings", f.name) for f in dataclasses.fields(StoreSettings)},
}


@dataclass(frozen=True)
class CaptureSpec(metaclass=HoldsParts):
    """How a store is captured: the three parts (:mod:`lens.capturing.settings`, whose fields give their defaults and
    help) and the capture's own settings. Every setting of a part reads and builds by its flat name as well
    (:data:`FLAT`: ``spec.corpus``, ``spec.replace(max_tokens=...)``, ``CaptureSpec(model="tiny-llama", ...)``), so a
    manifest's settings read as they always did. Every default is said once, in its part or here."""

    # the model: its name (anything lens.load_model takes: alias, Hugging Face id, folder, .gguf file, a
    # LoadedModel), the dtype of its weights and forward pass and its attention where a model named by its name is
    # loaded by the studies, the main job and the command line ("auto": bfloat16 on CUDA, float32 on a CPU, resolved
    # by ModelSettings.resolve; lens.capture is given a loaded model, or loads a name with lens.load_model's
    # defaults, and records the dtype it ran in), and where it runs: device None = where it is (a model loaded from
    # its name: LOAD_DEVICE)
    model_settings: ModelSettings = ModelSettings(device=None)
    # the text: corpus (a built-in corpus name, a .txt / .jsonl path, a list of strings or a Corpus), max_tokens
    # (None: all of it), which tokens a larger corpus gives (sample "spread": whole windows from every document in
    # turn, or "first": the documents in order; sample_seed), the window (seq_len), windows per forward pass
    # (batch_size) and a lens.text.transforms transform ("shuffle", "truncate:64", ...; None: the text as is)
    text: TextSettings = TextSettings()
    # the store: hook sites captured (given as Sites or their names, a list or one comma string, held as a tuple of
    # Site), every one at each of layers ("all", an int, a list, "0,3,5" or "2-6": lens.sites.expand_sites), the
    # positions of each window kept ("all", "last", "every:K", "first:K" or a list such as 0,5,-1), the stored
    # arrays' dtype (float32, float16 or bfloat16; not the model's) and tokens per shard on disk (rounded to whole
    # batches: shard_windows)
    store_settings: StoreSettings = StoreSettings()
    # where an in-memory store (out=None) holds its arrays: None = the model's device
    store_device: str | None = None
    # how states are read: "native" (forward hooks), "transformer-lens" or "nnsight"
    backend: str = "native"
    # nnsight backend: True runs on NDIF, "local" is nnsight's dry run of a remote request, False runs here
    remote: bool | str = False
    # overlap batching, device->host copies and shard writes with the forward pass (the same bytes either way)
    pipeline: bool = True
    # refuse a capture whose estimated store is larger than the free space where it is written
    check_space: bool = True

    FLAT = FLAT  # the flat names HoldsParts folds into the parts (a class attribute, not a field)
    model = flat_property("model_settings", "name")
    model_dtype = flat_property("model_settings", "dtype")
    attn = flat_property("model_settings", "attn")
    device = flat_property("model_settings", "device")
    corpus = flat_property("text", "corpus")
    max_tokens = flat_property("text", "max_tokens")
    sample = flat_property("text", "sample")
    sample_seed = flat_property("text", "sample_seed")
    seq_len = flat_property("text", "seq_len")
    batch_size = flat_property("text", "batch_size")
    transform = flat_property("text", "transform")
    sites = flat_property("store_settings", "sites")
    layers = flat_property("store_settings", "layers")
    dtype = flat_property("store_settings", "dtype")
    shard_tokens = flat_property("store_settings", "shard_tokens")
    positions = flat_property("store_settings", "positions")

    @classmethod
    def of(cls, model: ModelSettings | None = None, text: TextSettings | None = None,
           store: StoreSettings | None = None, **capture) -> "CaptureSpec":
        """A spec built from the parts (each left out: its defaults; the model part's device is where the model
        runs) and the capture's own fields (``backend``, ``pipeline``, ...) or flat settings."""
        return cls(model_settings=model or ModelSettings(), text=text or TextSettings(),
                   store_settings=store or StoreSettings(), **capture)

    @classmethod
    def from_flat(cls, **settings: Any) -> "CaptureSpec":
        """A spec of settings by their flat names and the capture's own fields (what ``CaptureSpec(**settings)``
        builds, through :class:`HoldsParts`; this one a type checker reads)."""
        return cls(**settings)

    def flat(self) -> dict:
        """Every setting by its flat name (:data:`FLAT`), then the capture's own fields: what :func:`lens.capture`
        takes as keywords."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _PARTS}
        return {**{name: getattr(self, name) for name in FLAT}, **own}

    @property
    def shard_windows(self) -> int:
        """Windows per shard: ``shard_tokens`` in whole batches of ``batch_size`` windows (at least one)."""
        return max(1, round(self.shard_tokens / self.seq_len / self.batch_size)) * self.batch_size

    def replace(self, **changes) -> "CaptureSpec":
        return dataclasses.replace(self, **changes)


_PARTS = frozenset(holder for holder, _ in FLAT.values())
CAPTURE_DEFAULTS = CaptureSpec()


def field_names() -> tuple[str, ...]:
    """The spec's settings by their flat names, then the capture's own fields (:meth:`CaptureSpec.flat`)."""
    return tuple(CAPTURE_DEFAULTS.flat())


def spec_from(spec: CaptureSpec | None, given: dict, what: str = "capture") -> CaptureSpec:
    """``spec``, or one built from keyword values ``given`` (field name -> value). A function that takes
    both (``capture(model, spec=...)``) refuses keywords that differ from their defaults beside a spec: the
    settings are in one or the other, never split between them."""
    if spec is None:
        return CaptureSpec.from_flat(**given)
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
