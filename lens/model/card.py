"""The typed model card: every fact about a model's family that an analysis may depend on.

A card is built once from the loaded model (:func:`lens.model.arch.derive_site_map`, from its module tree
and config), stored in every store manifest under ``"model"``, and read back with
:meth:`ModelCard.from_dict`. Analyses read the card — never a family-name string with a default.

Conventions:

* ``block`` says how a block composes its sub-blocks (see :class:`BlockKind`); it decides which
  sites exist (a parallel block has no ``resid_mid``, a recurrent block has no ``attn_out``).
* ``norm_kind`` is the arithmetic of the model's *final* norm (``rms`` / ``layer``), ``None`` when
  the model has none (post-norm encoders); ``norm_offset`` is 1.0 where the norm multiplies by
  ``1 + w`` (Gemma) and 0.0 otherwise. A fresh, weight-free norm of the same kind is what the
  probes put in front of a readout.
* ``sites`` lists the sites that exist in this family; ``absent`` maps every other site to the
  reason it does not exist (shown by ``lens inspect`` and in errors).
* ``padding_invariant``: the probe compared a padded row with its unpadded forward; a family whose
  token mixing is not masked (ConvBERT's convolution) is ``False`` and is captured without padding.
* ``logit_softcap`` (Gemma 2: ``c · tanh(z / c)``) and ``logit_scale`` (Cohere multiplies, Granite
  divides: stored as the factor that multiplies) are applied after the unembedding, as the model does.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields

from lens.errors import LensInputError, ModelLacks
from lens.sites import Site

CARD_VERSION = 2


class BlockKind(str, enum.Enum):
    """How one block turns ``resid_pre`` into ``resid_post``."""

    SEQUENTIAL = "sequential"  # pre-norm: h += attn(norm(h)); h += mlp(norm(h))  (Llama, GPT-2, OPT)
    SANDWICH = "sandwich"      # h += norm(attn(norm(h))); h += norm(mlp(norm(h)))  (Gemma 2/3, OLMo 2)
    PARALLEL = "parallel"      # h += attn(norm(h)) + mlp(norm'(h))  (GPT-J, NeoX, Falcon, Phi-1/2, Cohere)
    POST_NORM = "post_norm"    # h = norm(h + attn(h)); h = norm(h + mlp(h))  (BERT, RoBERTa, ELECTRA)
    RECURRENT = "recurrent"    # one mixer without an attention / MLP split (Mamba, RWKV, hybrids)
    UNVERIFIED = "unverified"  # the model could not be run to check its blocks (meta weights, remote)


class NormKind(str, enum.Enum):
    RMS = "rms"
    LAYER = "layer"


@dataclass(frozen=True)
class ModelCard:
    """What a study may know about the model behind a store (see the module docstring)."""

    model_id: str
    model_type: str
    block: BlockKind
    norm_kind: NormKind | None
    is_causal: bool
    has_lm_head: bool
    n_layers: int
    d_model: int
    d_vocab: int
    sites: tuple[str, ...]
    absent: dict = field(default_factory=dict)  # site -> why it does not exist in this family
    architecture: str = ""  # the transformers class name
    revision: str = ""
    source: str = ""
    n_params: int = 0
    dtype: str = "float32"
    norm_offset: float = 0.0
    position: str = "unknown"  # rotary | learned | alibi | relative | none | unknown
    embed_scale: float | None = None
    logit_softcap: float | None = None
    logit_scale: float = 1.0
    tied_embeddings: bool = False
    n_experts: int = 0  # 0: dense MLP; > 0: mixture of experts (mlp_out = combined expert output)
    site_layers: dict = field(default_factory=dict)  # site -> layers, for sites present at some layers only
    verified: bool = True  # every site's tap was checked on a probe forward pass of the model
    head_note: str = ""  # why the logit lens is unavailable, when it is
    # a padded row gives the states of its unpadded forward (checked by the probe); False: the capture ran
    # without padding (windows of equal length batched together); None: not checked
    padding_invariant: bool | None = None
    # site -> per-layer factor the site's module tensor is multiplied by, as the model adds or passes it on:
    # resid_post of a rescaled stream (RWKV's rescale_every halves it every k blocks), attn_out / mlp_out of
    # scaled sub-blocks (MiniCPM's scale_depth / sqrt(n_layers)); a site not listed has factor 1 everywhere
    site_scales: dict = field(default_factory=dict)

    @property
    def family(self) -> str:
        """The transformers ``model_type`` (``llama``, ``gemma2``, ``gpt_neox``, ...)."""
        return self.model_type

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def has_site(self, site) -> bool:
        return Site.parse(site).value in self.sites

    def require_site(self, site) -> None:
        """Raise a clear error when ``site`` does not exist in this family."""
        name = Site.parse(site).value
        if name not in self.sites:
            why = self.absent.get(name, "not mapped for this family")
            raise ModelLacks(
                f"site {name!r} does not exist in {self.model_id} ({self.model_type}, {self.block.value} "
                f"blocks): {why}; available: {', '.join(self.sites)}")

    def require_lm_head(self) -> None:
        if not self.has_lm_head:
            raise ModelLacks(
                f"{self.model_id} ({self.model_type}) has no usable language-model head: the logit / tuned lens "
                "needs the model's final norm and unembedding (expected a causal LM; got "
                f"{'an encoder' if not self.is_causal else 'a model whose head could not be used'}"
                f"{': ' + self.head_note if self.head_note else ''})")

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        out = asdict(self)
        out["block"] = self.block.value
        out["norm_kind"] = None if self.norm_kind is None else self.norm_kind.value
        out["sites"] = list(self.sites)
        out["family"] = self.family
        out["card_version"] = CARD_VERSION
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ModelCard":
        """Read a card back from a manifest; a store written before cards were typed (no
        ``card_version``) is read from its three-family table entry."""
        if not isinstance(data, dict):
            raise LensInputError(f"the model card must be a JSON object; got {type(data).__name__}")
        if "card_version" not in data:
            data = _legacy(data)
        names = {f.name for f in fields(cls)}
        required = [f.name for f in fields(cls) if f.default is f.default_factory is _MISSING]
        missing = [n for n in required if n not in data]
        if missing:
            raise LensInputError(f"the model card lacks {', '.join(missing)} (expected every field of ModelCard)")
        kw = {k: v for k, v in data.items() if k in names}
        try:
            kw["block"] = BlockKind(kw["block"])
            kw["norm_kind"] = None if kw["norm_kind"] is None else NormKind(kw["norm_kind"])
        except ValueError as exc:
            raise LensInputError(f"the model card has an unknown value: {exc}") from None
        kw["sites"] = tuple(kw["sites"])
        kw["absent"] = dict(kw.get("absent") or {})
        kw["site_layers"] = {k: list(v) for k, v in (kw.get("site_layers") or {}).items()}
        kw["site_scales"] = {k: list(v) for k, v in (kw.get("site_scales") or {}).items()}
        return cls(**kw)


_MISSING = fields(ModelCard)[0].default  # dataclasses.MISSING, without importing the private name


# The three table families of card-less stores (format 1 manifests, before typed cards).
_LEGACY = {
    "llama": (BlockKind.SEQUENTIAL, NormKind.RMS, "rotary"),
    "gpt2": (BlockKind.SEQUENTIAL, NormKind.LAYER, "learned"),
    "bert": (BlockKind.POST_NORM, None, "learned"),
}
_ALL_SITES = ("embed", "resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "final_norm")


def _legacy(data: dict) -> dict:
    family = data.get("family")
    if family not in _LEGACY:
        raise LensInputError(
            f"the store's model card has no card_version and an unknown family {family!r}: expected one of "
            f"{', '.join(_LEGACY)} (stores written by older versions) — recapture it")
    block, norm, position = _LEGACY[family]
    sites = tuple(s for s in _ALL_SITES if not (norm is None and s == "final_norm"))
    absent = {} if norm is not None else {"final_norm": "post-norm encoder: every block ends in its own norm"}
    return {**data, "block": block.value, "norm_kind": None if norm is None else norm.value,
            "sites": sites, "absent": absent, "position": position, "card_version": 1}
