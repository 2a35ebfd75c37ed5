"""What a model's config says: layer count, width, vocabulary, and whether it is causal (the text model's
config, in a multimodal model)."""

from __future__ import annotations

from torch import nn

from lens.errors import LensInputError
from lens.model.arch import names as N


def text_config(model: nn.Module):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def config_int(cfg, attrs) -> int | None:
    for a in attrs:
        v = getattr(cfg, a, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def n_layers_of(model: nn.Module) -> int:
    n = config_int(text_config(model), N.N_LAYER_ATTRS)
    if n is None:
        raise LensInputError(
            f"{type(model).__name__}: its config has no layer count (expected one of {', '.join(N.N_LAYER_ATTRS)})")
    return n


def d_model_of(model: nn.Module) -> int:
    cfg = text_config(model)
    for a in ("hidden_size", "d_model", "n_embd", "dim", "model_dim"):
        v = getattr(cfg, a, None)
        if isinstance(v, int) and v > 0:
            return v
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if emb is not None and hasattr(emb, "weight"):
        return int(emb.weight.shape[1])
    raise LensInputError(f"{type(model).__name__}: cannot tell the model width from its config")


def vocab_of(model: nn.Module) -> int:
    cfg = text_config(model)
    v = getattr(cfg, "vocab_size", None)
    if isinstance(v, int) and v > 0:
        return v
    emb = model.get_input_embeddings()
    return int(emb.weight.shape[0])


def is_causal_model(model: nn.Module) -> bool:
    """Decoders attend to the past only; masked-LM families are causal only when built as decoders."""
    from transformers.models.auto import modeling_auto as auto  # lazy: import cost (transformers 1.5 s)

    mt = getattr(model.config, "model_type", "")
    if mt in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return bool(getattr(text_config(model), "is_decoder", False))
    return True
