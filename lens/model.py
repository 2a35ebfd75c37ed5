"""The loaded model: a Hugging Face module, its tokenizer, and what the analyses need from it.

A `LoadedModel` exposes the layer count, widths, the hook-site table entry for its family and the
final norm + unembedding, so the logit lens decodes any state exactly as the model does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from lens.errors import LensInputError
from lens.sites import Architecture, _find


@dataclass
class LoadedModel:
    hf_model: nn.Module
    tokenizer: object
    model_id: str
    arch: Architecture
    revision: str = ""
    source: str = ""  # where it came from (alias, path, hub id)
    extra: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ shape
    @property
    def family(self) -> str:
        return self.arch.family

    @property
    def config(self):
        return self.hf_model.config

    @property
    def n_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def d_model(self) -> int:
        return int(self.config.hidden_size)

    @property
    def d_vocab(self) -> int:
        return int(self.config.vocab_size)

    @property
    def is_causal(self) -> bool:
        return self.arch.is_causal

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.hf_model.parameters()).dtype

    @property
    def layers(self) -> nn.ModuleList:
        return _find(self.hf_model, self.arch.layers)

    # ------------------------------------------------------------- readout
    @property
    def has_lm_head(self) -> bool:
        return self.unembed_module is not None and self.final_norm is not None

    @property
    def final_norm(self) -> nn.Module | None:
        return _find(self.hf_model, self.arch.final_norm) if self.arch.final_norm else None

    @property
    def unembed_module(self) -> nn.Module | None:
        if not self.arch.unembed:
            return None
        try:
            return self.hf_model.get_submodule(self.arch.unembed)
        except AttributeError:
            return None

    def _require_head(self) -> None:
        if not self.has_lm_head:
            raise LensInputError(
                f"{self.model_id} is an encoder without a language-model head: the logit lens needs "
                "a final norm and an unembedding (use a causal LM such as smollm2-135m)"
            )

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from already final-normed states (..., d_model) -> (..., d_vocab)."""
        self._require_head()
        return self.unembed_module(x)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Logit lens: the model's own final norm, then its unembedding."""
        self._require_head()
        return self.unembed_module(self.final_norm(x))

    def card(self):
        """The typed model card (:class:`lens.card.ModelCard`) kept in every store manifest."""
        from lens.card import BlockKind, ModelCard, NormKind

        block = BlockKind.POST_NORM if self.arch.family == "bert" else BlockKind.SEQUENTIAL
        norm = None if self.arch.final_norm is None else NormKind(self.arch.norm_kind)
        sites = tuple(s.value for s in self.arch.taps)
        head = self.unembed_module
        emb = self.hf_model.get_input_embeddings() if hasattr(self.hf_model, "get_input_embeddings") else None
        return ModelCard(
            model_id=self.model_id, model_type=str(getattr(self.config, "model_type", "")), block=block,
            norm_kind=norm, is_causal=self.is_causal, has_lm_head=self.has_lm_head, n_layers=self.n_layers,
            d_model=self.d_model, d_vocab=self.d_vocab, sites=sites,
            absent={} if norm is not None else {"final_norm": "post-norm encoder: every block ends in its own norm"},
            architecture=type(self.hf_model).__name__, revision=self.revision, source=self.source,
            n_params=int(sum(p.numel() for p in self.hf_model.parameters())),
            dtype=str(self.dtype).replace("torch.", ""),
            tied_embeddings=bool(head is not None and emb is not None and head.weight is emb.weight),
        )
