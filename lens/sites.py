"""Typed hook sites and the one table per architecture family that maps them to modules.

Conventions (fixed once here):

* Layers are 0-based. ``resid_post`` of layer ``l`` is the output of block ``l``;
  ``resid_pre`` of layer ``l`` is its input, so ``resid_pre[l+1] == resid_post[l]``.
* ``embed`` is the input of block 0 (token + position embeddings, with any scaling the model
  applies), i.e. Hugging Face's ``hidden_states[0]``.
* ``resid_mid`` is the residual stream after attention and before the MLP (the input of the
  post-attention norm in pre-norm models; the output of the attention sub-block in BERT).
* ``attn_out`` / ``mlp_out`` are the sub-blocks' outputs before they are added to the residual.
* ``final_norm`` is the output of the final norm (not defined for encoders without one).

Strings naming modules appear only in ``ARCHITECTURES`` below.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Sequence

from torch import nn

from lens.errors import LensInputError


class Site(str, enum.Enum):
    """Where in a block a state is read."""

    EMBED = "embed"
    RESID_PRE = "resid_pre"
    RESID_MID = "resid_mid"
    RESID_POST = "resid_post"
    ATTN_OUT = "attn_out"
    MLP_OUT = "mlp_out"
    FINAL_NORM = "final_norm"

    @property
    def per_layer(self) -> bool:
        return self not in (Site.EMBED, Site.FINAL_NORM)

    @classmethod
    def parse(cls, value: "str | Site") -> "Site":
        if isinstance(value, Site):
            return value
        try:
            return cls(str(value).strip().lower().replace("-", "_"))
        except ValueError:
            names = ", ".join(s.value for s in cls)
            raise LensInputError(f"unknown site {value!r}: expected one of {names}") from None


@dataclass(frozen=True, order=True)
class HookSite:
    """A site at a layer. ``layer`` is None for the single-position sites embed / final_norm."""

    site: Site
    layer: int | None = None

    @property
    def key(self) -> str:
        """Stable name used in stores and results (``resid_post.12``, ``embed``)."""
        return self.site.value if self.layer is None else f"{self.site.value}.{self.layer}"

    @classmethod
    def from_key(cls, key: str) -> "HookSite":
        name, _, layer = key.partition(".")
        return cls(Site.parse(name), int(layer) if layer else None)


@dataclass(frozen=True)
class Tap:
    """How to read one site from a module: its output (``output``) or its first input (``input``)."""

    path: str  # module path with ``{l}`` for the layer index
    kind: str  # "output" | "input"


@dataclass(frozen=True)
class Architecture:
    family: str
    model_types: tuple[str, ...]
    layers: str  # path of the ModuleList of blocks
    taps: dict  # Site -> Tap
    final_norm: str | None
    unembed: str | None
    norm_kind: str  # "rms" | "layer"
    is_causal: bool


# The single place where module-name strings live.
ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture(
        family="llama",
        model_types=("llama", "mistral", "qwen2", "qwen3", "gemma", "olmo", "smollm3", "granite"),
        layers="model.layers",
        taps={
            Site.EMBED: Tap("model.layers.0", "input"),
            Site.RESID_PRE: Tap("model.layers.{l}", "input"),
            Site.RESID_MID: Tap("model.layers.{l}.post_attention_layernorm", "input"),
            Site.RESID_POST: Tap("model.layers.{l}", "output"),
            Site.ATTN_OUT: Tap("model.layers.{l}.self_attn", "output"),
            Site.MLP_OUT: Tap("model.layers.{l}.mlp", "output"),
            Site.FINAL_NORM: Tap("model.norm", "output"),
        },
        final_norm="model.norm",
        unembed="lm_head",
        norm_kind="rms",
        is_causal=True,
    ),
    Architecture(
        family="gpt2",
        model_types=("gpt2",),
        layers="transformer.h",
        taps={
            Site.EMBED: Tap("transformer.h.0", "input"),
            Site.RESID_PRE: Tap("transformer.h.{l}", "input"),
            Site.RESID_MID: Tap("transformer.h.{l}.ln_2", "input"),
            Site.RESID_POST: Tap("transformer.h.{l}", "output"),
            Site.ATTN_OUT: Tap("transformer.h.{l}.attn", "output"),
            Site.MLP_OUT: Tap("transformer.h.{l}.mlp", "output"),
            Site.FINAL_NORM: Tap("transformer.ln_f", "output"),
        },
        final_norm="transformer.ln_f",
        unembed="lm_head",
        norm_kind="layer",
        is_causal=True,
    ),
    Architecture(
        family="bert",
        model_types=("bert",),
        layers="encoder.layer",
        taps={
            Site.EMBED: Tap("embeddings", "output"),
            Site.RESID_PRE: Tap("encoder.layer.{l}", "input"),
            Site.RESID_MID: Tap("encoder.layer.{l}.attention", "output"),
            Site.RESID_POST: Tap("encoder.layer.{l}", "output"),
            Site.ATTN_OUT: Tap("encoder.layer.{l}.attention.output.dense", "output"),
            Site.MLP_OUT: Tap("encoder.layer.{l}.output.dense", "output"),
        },
        final_norm=None,
        unembed=None,
        norm_kind="layer",
        is_causal=False,
    ),
)


def architecture_for(model: nn.Module) -> Architecture:
    """The table entry for a Hugging Face model, matched on ``config.model_type`` and checked
    against the modules the model really has."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for arch in ARCHITECTURES:
        if model_type in arch.model_types:
            root = _strip_prefix(model, arch)
            if root is not None:
                return arch
    # Unknown type: say which sites could not be mapped under each known family.
    report = []
    for arch in ARCHITECTURES:
        missing = [s.value for s, tap in arch.taps.items() if _find(model, tap.path.format(l=0)) is None]
        report.append(f"{arch.family}: cannot map {', '.join(missing) or 'nothing'}")
    raise LensInputError(
        f"architecture {model_type!r} ({type(model).__name__}) is not in the hook-site table; "
        f"tried {'; '.join(report)}. Supported model types: "
        + ", ".join(t for a in ARCHITECTURES for t in a.model_types)
    )


def _find(model: nn.Module, path: str) -> nn.Module | None:
    found = _find_path(model, path)
    return None if found is None else model.get_submodule(found)


def _find_path(model: nn.Module, path: str) -> str | None:
    """The real dotted path of ``path`` in ``model``; tolerates a base model without the task
    head's prefix (``BertModel`` vs ``BertForMaskedLM.bert``)."""
    for candidate in _path_variants(model, path):
        try:
            model.get_submodule(candidate)
            return candidate
        except AttributeError:
            continue
    return None


def _path_variants(model: nn.Module, path: str) -> list[str]:
    variants = [path]
    base = getattr(model, "base_model_prefix", "")
    if base and hasattr(model, base):
        variants.append(f"{base}.{path}")
    head, _, rest = path.partition(".")
    if rest and head in ("model", "transformer") and not hasattr(model, head):
        variants.append(rest)  # a bare LlamaModel / GPT2Model
    return variants


def _strip_prefix(model: nn.Module, arch: Architecture) -> nn.Module | None:
    return _find(model, arch.layers)


def resolve(model: nn.Module, arch: Architecture, hook: HookSite) -> tuple[nn.Module, str]:
    """The module and tap kind for ``hook`` in ``model``."""
    path, kind = resolve_path(model, arch, hook)
    return model.get_submodule(path), kind


def resolve_path(model: nn.Module, arch: Architecture, hook: HookSite) -> tuple[str, str]:
    """The dotted module path and tap kind ("input" / "output") for ``hook`` in ``model``."""
    tap = arch.taps.get(hook.site)
    if tap is None:
        raise LensInputError(
            f"site {hook.site.value!r} is not defined for the {arch.family} family "
            f"(available: {', '.join(s.value for s in arch.taps)})"
        )
    path = _find_path(model, tap.path.format(l=hook.layer if hook.layer is not None else 0))
    if path is None:
        raise LensInputError(f"could not map site {hook.key!r} to a module of {type(model).__name__}")
    return path, tap.kind


# TransformerLens (TransformerBridge) hook names for the same sites: the only other place
# where hook-name strings appear.
TRANSFORMER_LENS_HOOKS: dict[Site, str] = {
    Site.EMBED: "blocks.0.hook_resid_pre",
    Site.RESID_PRE: "blocks.{l}.hook_resid_pre",
    Site.RESID_MID: "blocks.{l}.hook_resid_mid",
    Site.RESID_POST: "blocks.{l}.hook_resid_post",
    Site.ATTN_OUT: "blocks.{l}.hook_attn_out",
    Site.MLP_OUT: "blocks.{l}.hook_mlp_out",
    Site.FINAL_NORM: "ln_final.hook_out",  # hook_normalized is before the weight
}


def transformer_lens_hook(hook: HookSite) -> str:
    return TRANSFORMER_LENS_HOOKS[hook.site].format(l=hook.layer if hook.layer is not None else 0)


def expand_sites(
    sites: Iterable["str | Site"], layers: "str | int | Sequence[int] | None", n_layers: int
) -> list[HookSite]:
    """Turn user-facing ``sites`` + ``layers`` ("all", an int, a list, "0,3,5" or "2-6") into
    hook sites, validating every layer index against ``n_layers``."""
    layer_list = parse_layers(layers, n_layers)
    out: list[HookSite] = []
    for s in sites:
        site = Site.parse(s)
        if site.per_layer:
            out.extend(HookSite(site, l) for l in layer_list)
        else:
            out.append(HookSite(site, None))
    if not out:
        raise LensInputError("no sites selected: expected at least one site such as 'resid_post'")
    return out


def parse_layers(layers: "str | int | Sequence[int] | None", n_layers: int) -> list[int]:
    if layers is None or (isinstance(layers, str) and layers.strip().lower() == "all"):
        return list(range(n_layers))
    if isinstance(layers, int):
        items = [layers]
    elif isinstance(layers, str):
        items = []
        for part in layers.split(","):
            part = part.strip()
            if not part:
                continue
            lo, sep, hi = part.partition("-")
            try:
                if sep and lo:
                    items.extend(range(int(lo), int(hi) + 1))
                else:
                    items.append(int(part))
            except ValueError:
                raise LensInputError(
                    f"bad layer list {layers!r}: expected 'all', integers like '0,3,5' or a range '2-6'"
                ) from None
    else:
        items = [int(x) for x in layers]
    bad = [l for l in items if not -n_layers <= l < n_layers]
    if bad:
        raise LensInputError(
            f"layer {bad[0]} does not exist: the model has {n_layers} layers (0..{n_layers - 1})"
        )
    return sorted({l % n_layers for l in items})
