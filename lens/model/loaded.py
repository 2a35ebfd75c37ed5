"""The loaded model: a Hugging Face module, its tokenizer, and what the analyses need from it.

A `LoadedModel` exposes the layer count and widths, the site map derived for its family
(:mod:`lens.model.arch`) and the typed model card, and the final norm + unembedding (with the family's
logit scale and soft cap), so the logit lens decodes any state exactly as the model does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from lens.model.arch import SiteMap, apply_logit_factors
from lens.model.arch.config import d_model_of, vocab_of
from lens.model.card import ModelCard
from lens.model.placement import input_device


@dataclass
class LoadedModel:
    hf_model: nn.Module
    tokenizer: object
    model_id: str
    site_map: SiteMap
    revision: str = ""
    source: str = ""  # where it came from (alias, path, hub id)
    extra: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ shape
    @property
    def family(self) -> str:
        """The transformers ``model_type`` (``llama``, ``gemma2``, ``gpt_neox``, ...)."""
        return self.site_map.model_type

    @property
    def config(self):
        return self.hf_model.config

    @property
    def n_layers(self) -> int:
        return self.site_map.n_layers

    @property
    def d_model(self) -> int:
        return d_model_of(self.hf_model)

    @property
    def d_vocab(self) -> int:
        return vocab_of(self.hf_model)

    @property
    def is_causal(self) -> bool:
        return self.site_map.is_causal

    @property
    def device(self) -> torch.device:
        """Where a batch goes in (for a model split by accelerate: the first device holding weights)."""
        return input_device(self.hf_model)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.hf_model.parameters()).dtype

    @property
    def layers(self) -> nn.ModuleList:
        return self.hf_model.get_submodule(self.site_map.layers)

    # ------------------------------------------------------------- readout
    @property
    def has_lm_head(self) -> bool:
        """True when decoding the last block's output through the model's own head reproduces its logits."""
        return self.site_map.head.usable

    @property
    def final_norm(self) -> nn.Module | None:
        head = self.site_map.head
        return self.hf_model.get_submodule(head.norm) if head.norm else None

    @property
    def unembed_module(self) -> nn.Module | None:
        head = self.site_map.head
        return self.hf_model.get_submodule(head.unembed) if head.unembed else None

    def _require_head(self) -> None:
        if not self.site_map.head.usable:  # the card (and its message) only when refusing: it walks every parameter
            self.card().require_lm_head()

    def pre_unembed(self, x: torch.Tensor) -> torch.Tensor:
        """The model's final norm (none in a post-norm decoder), then whatever it runs before the unembedding
        (OPT's project_out)."""
        self._require_head()
        norm = self.final_norm
        x = norm(x) if norm is not None else x
        for path in self.site_map.head.chain:
            x = self.hf_model.get_submodule(path)(x)
        return x

    def logit_factors(self, logits: torch.Tensor) -> torch.Tensor:
        """The family's logit scale and soft cap, applied to raw unembedding outputs."""
        head = self.site_map.head
        return apply_logit_factors(logits, head.scale, head.softcap)

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from already final-normed states (..., d_model) -> (..., d_vocab)."""
        self._require_head()
        return self.logit_factors(self.unembed_module(x))

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Logit lens: the model's own final norm, then its unembedding (and logit scale / soft cap)."""
        return self.unembed(self.pre_unembed(x))

    def card(self) -> ModelCard:
        """The typed model card (:class:`lens.model.card.ModelCard`) kept in every store manifest."""
        sm = self.site_map
        head = self.unembed_module
        emb = self.hf_model.get_input_embeddings() if hasattr(self.hf_model, "get_input_embeddings") else None
        absent = {s.value: why for s, why in sm.absent.items()}
        if sm.site_layers:
            for s, ls in sm.site_layers.items():
                absent.setdefault(s.value, f"exists at layers {list(ls)} only")
        return ModelCard(
            model_id=self.model_id, model_type=sm.model_type, block=sm.block,
            norm_kind=sm.head.norm_kind, is_causal=sm.is_causal, has_lm_head=sm.head.usable,
            n_layers=sm.n_layers, d_model=self.d_model, d_vocab=self.d_vocab,
            sites=tuple(s.value for s in sm.sites()), absent=absent, architecture=sm.architecture,
            revision=self.revision, source=self.source,
            n_params=int(sum(p.numel() for p in self.hf_model.parameters())),
            dtype=str(self.dtype).replace("torch.", ""), norm_offset=sm.head.norm_offset,
            position=sm.position, embed_scale=sm.embed_scale, logit_softcap=sm.head.softcap,
            logit_scale=sm.head.scale,
            tied_embeddings=bool(head is not None and emb is not None and head.weight is emb.weight),
            n_experts=sm.n_experts, site_layers={s.value: list(ls) for s, ls in sm.site_layers.items()},
            verified=sm.verified, padding_invariant=sm.padding_invariant,
            site_scales={s.value: list(v) for s, v in sm.scales.items()}, head_note="" if sm.head.usable else (sm.head.why_not or "no language-model head"),
        )
