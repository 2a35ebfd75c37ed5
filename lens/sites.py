"""Typed hook sites: what each site means, the same in every architecture family.

Which module reads a site in a given model is derived from that model (:mod:`lens.model.arch`); a site
that does not exist in a family is absent there, with the reason, and never read from a neighbour.

Conventions (fixed once here):

* Layers are 0-based. ``resid_post`` of layer ``l`` is the output of block ``l``;
  ``resid_pre`` of layer ``l`` is its input, so ``resid_pre[l+1] == resid_post[l]``.
* ``embed`` is the input of block 0 (token + position embeddings, with any scaling the model
  applies), i.e. Hugging Face's ``hidden_states[0]``.
* ``resid_mid`` is the residual stream after attention and before the MLP: ``resid_pre + attn_out``
  (pre-norm and sandwich blocks); ``norm(resid_pre + attn_out)`` in post-norm encoders (BERT). It
  does not exist where attention and MLP run in parallel (GPT-J, NeoX, Falcon, Phi-1/2, Cohere).
* ``attn_out`` / ``mlp_out`` are what the sub-blocks add to the residual: after the sandwich norm
  where there is one (Gemma 2/3, OLMo 2); ``mlp_out`` of a mixture of experts is the combined
  expert output. So ``resid_post = resid_pre + attn_out + mlp_out`` in every pre-norm family.
* ``router_logits`` are a mixture-of-experts router's logits (token, n_experts), at the MoE layers.
* ``final_norm`` is the output of the final norm (absent in post-norm encoders).
* State-space, recurrent and hybrid blocks have ``embed``, ``resid_pre``, ``resid_post`` and
  ``final_norm`` only.

Module-name strings live in :mod:`lens.model.arch.names`; TransformerLens hook names in :mod:`lens.capturing.backends.tl`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Sequence

from lens.errors import LensInputError


class Site(str, enum.Enum):
    """Where in a block a state is read."""

    EMBED = "embed"
    RESID_PRE = "resid_pre"
    RESID_MID = "resid_mid"
    RESID_POST = "resid_post"
    ATTN_OUT = "attn_out"
    MLP_OUT = "mlp_out"
    ROUTER_LOGITS = "router_logits"
    FINAL_NORM = "final_norm"

    # a site reads as its name wherever a string did ("resid_post", as enum.StrEnum does): in f-strings, file
    # names and messages (Python 3.11 formats a str-mixin enum as "Site.RESID_POST"), so a Site can be passed
    # wherever a site's name was
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

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


# the residual stream after each block: the site a capture, a store read and a one-site study take unless told
DEFAULT_SITE = Site.RESID_POST
# the site whose last layer the model's output is read from (through its final norm and unembedding): what a
# lens of any site is checked and trained against
OUTPUT_SITE = Site.RESID_POST


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


def expand_sites(
    sites: Iterable["str | Site"], layers: "str | int | Sequence[int] | None", n_layers: int, site_map=None
) -> list[HookSite]:
    """Turn user-facing ``sites`` + ``layers`` ("all", an int, a list, "0,3,5" or "2-6") into
    hook sites, validating every layer index against ``n_layers``. With a ``site_map``
    (:class:`lens.model.arch.SiteMap`), a site absent in the family is refused with its reason, and
    "all" layers of a site that exists at some layers only (MoE routers) means those layers."""
    layer_list = parse_layers(layers, n_layers)
    every = layers is None or (isinstance(layers, str) and layers.strip().lower() == "all")
    out: list[HookSite] = []
    seen: set = set()
    for s in sites:
        site = Site.parse(s)
        if site in seen:  # "resid_post,resid_post" is resid_post once, not two writers of one array
            continue
        seen.add(site)
        if site.per_layer:
            chosen = layer_list
            if site_map is not None and every:
                chosen = [l for l in layer_list if l in site_map.layers_of(site)]
            hooks = [HookSite(site, l) for l in chosen]
        else:
            hooks = [HookSite(site, None)]
        if site_map is not None:
            for h in hooks or [HookSite(site, layer_list[0] if site.per_layer else None)]:
                site_map.tap(h)  # raises a clear error for an absent site or layer
        out.extend(hooks)
    if not out:
        raise LensInputError("no sites selected: expected at least one site such as 'resid_post'")
    return out


def parse_layers(layers: "str | int | Sequence[int] | None", n_layers: int) -> list[int]:
    if layers is None or (isinstance(layers, str) and layers.strip().lower() == "all"):
        return list(range(n_layers))
    if isinstance(layers, int):
        items = [layers]
    elif isinstance(layers, str):
        expected = "expected 'all', integers like '0,3,5' or a range '2-6'"
        items = []
        for part in layers.split(","):
            part = part.strip()
            if not part:
                continue
            lo, sep, hi = part.partition("-")
            try:
                if sep and lo:
                    first, last = int(lo), int(hi)
                    if first > last:  # an empty range would select nothing, silently
                        raise LensInputError(f"bad layer range {part!r} in {layers!r}: it runs backwards "
                                             f"({expected}, low to high)")
                    # the ends alone first: "0-10**12" must not build a list of 10**12 layers to refuse it
                    items.extend([first, last] if last - first > n_layers else range(first, last + 1))
                else:
                    items.append(int(part))
            except ValueError as exc:
                if isinstance(exc, LensInputError):
                    raise
                raise LensInputError(f"bad layer list {layers!r}: {expected}") from None
        if not items:
            raise LensInputError(f"no layers selected by {layers!r}: {expected}")
    else:
        items = [int(x) for x in layers]
    bad = [l for l in items if not -n_layers <= l < n_layers]
    if bad:
        raise LensInputError(
            f"layer {bad[0]} does not exist: the model has {n_layers} layers (0..{n_layers - 1})"
        )
    return sorted({l % n_layers for l in items})
