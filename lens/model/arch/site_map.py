"""A model's site map: for each site, the module tap that reads it, or why the site does not exist.

Built by :func:`lens.model.arch.derive.derive_site_map`; read by the capture backends, the logit lens
(:class:`Head`) and ``lens inspect``. Paths carry ``{l}`` for the layer index.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lens.model.arch.taps import Tap
from lens.model.card import BlockKind, NormKind
from lens.errors import LensInputError
from lens.sites import HookSite, Site


@dataclass(frozen=True)
class Head:
    """How the model turns its last residual state into logits: ``norm`` (the final norm), then the
    modules in ``chain`` (OPT's ``project_out``), then ``unembed``, then ``logits · scale`` and
    Gemma 2's soft cap ``c · tanh(z / c)``. ``verified``: on the probe batch, decoding the last
    block's output this way reproduced the model's own logits (``max_diff``)."""

    norm: str | None = None
    chain: tuple[str, ...] = ()
    unembed: str | None = None
    norm_kind: NormKind | None = None
    norm_offset: float = 0.0
    softcap: float | None = None
    scale: float = 1.0
    verified: bool = False
    max_diff: float | None = None
    why_not: str = ""  # why there is no logit lens (empty when there is one)

    @property
    def usable(self) -> bool:
        return self.unembed is not None and self.verified and not self.why_not


@dataclass(frozen=True)
class SiteMap:
    model_type: str
    architecture: str
    layers: str  # path of the ModuleList of blocks
    n_layers: int
    block: BlockKind
    taps: dict  # Site -> Tap
    absent: dict  # Site -> reason
    head: Head = field(default_factory=Head)
    site_layers: dict = field(default_factory=dict)  # Site -> layers, for sites present at some layers only
    verified: bool = True  # every tap was checked on a probe forward pass
    notes: tuple[str, ...] = ()
    position: str = "unknown"
    embed_scale: float | None = None
    n_experts: int = 0
    is_causal: bool = True
    order: dict = field(default_factory=dict)  # Site -> when a block reaches it (probe; nnsight needs it)
    # a padded row gives its unpadded forward's states (probe); False: windows are captured without padding
    padding_invariant: bool | None = None  # None: not checked (unverified map, or the check could not run)
    padding_max_rel: float | None = None
    # Site -> per-layer factor a tap's tensor is multiplied by (RWKV's rescaled stream: resid_post; MiniCPM's
    # scaled sub-blocks: attn_out / mlp_out as added to the stream); absent: 1 at every layer
    scales: dict = field(default_factory=dict)

    def scale(self, hook: HookSite) -> float:
        per_layer = self.scales.get(hook.site)
        if not per_layer:
            return 1.0
        return float(per_layer[hook.layer if hook.layer is not None else 0])

    def sites(self) -> list[Site]:
        return [s for s in Site if s in self.taps]

    def layers_of(self, site: Site) -> list[int]:
        if site in self.site_layers:
            return list(self.site_layers[site])
        return list(range(self.n_layers))

    def tap(self, hook: HookSite) -> Tap:
        """The tap for ``hook``; a clear error when the site is absent in this family or at that layer."""
        tap = self.taps.get(hook.site)
        if tap is None:
            why = self.absent.get(hook.site, "not mapped for this family")
            raise LensInputError(
                f"site {hook.site.value!r} does not exist in {self.model_type} ({self.block.value} blocks): {why}; "
                f"available: {', '.join(s.value for s in self.sites())}")
        if hook.layer is not None and hook.site in self.site_layers and hook.layer not in self.site_layers[hook.site]:
            have = self.site_layers[hook.site]
            raise LensInputError(
                f"site {hook.site.value!r} does not exist at layer {hook.layer} of {self.model_type}: "
                f"it exists at layers {_ranges(have)} ({self.absent.get(hook.site, 'the other layers have none')})")
        return tap

    def path(self, hook: HookSite) -> str:
        return self.tap(hook).at(hook.layer)


def _ranges(layers) -> str:
    layers = sorted(layers)
    if not layers:
        return "none"
    out, lo, prev = [], layers[0], layers[0]
    for l in layers[1:] + [None]:
        if l is not None and l == prev + 1:
            prev = l
            continue
        out.append(f"{lo}" if lo == prev else f"{lo}-{prev}")
        if l is not None:
            lo = prev = l
    return ",".join(out)
