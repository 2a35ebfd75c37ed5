"""Tiny random-weight models of any transformers family, built offline from their configs.

``lens.load_model("tiny:gemma2")`` builds a 3-layer, 64-wide random Gemma 2 (fixed seed) with a
packaged tokenizer — SmolLM2's for decoders, MiniLM's for encoders — so every family's site map,
capture and lens can be tried and tested without a download.

Sizes are set only where the family's config has the field (``hidden_size`` maps to ``n_embd`` in
GPT-2 through the config's own attribute map), so each family keeps its own structure; a few
families need an override to build at this size (:data:`OVERRIDES`).
"""

from __future__ import annotations

import torch

from lens.errors import LensInputError
from lens.model.packaged import minilm_tokenizer, smollm2_tokenizer

PREFIX = "tiny:"  # tiny:<model_type>, a random model of any transformers family
SEED = 0

# Small sizes, set on a family's config only where its default config has the field.
SMALL = {
    "hidden_size": 64, "num_hidden_layers": 3, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512, "rotary_dim": 8,
    # mixtures of experts
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    # multi-head latent attention (DeepSeek-V2/V3 family)
    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    # state-space / recurrent
    "state_size": 8, "time_step_rank": 8, "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2,
    "mamba_n_heads": 8, "mamba_d_head": 16, "n_groups": 1, "num_heads": 4, "attention_hidden_size": 64,
    "ssm_state_size": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}

# Families whose default config does not build at the small size without a nudge.
OVERRIDES: dict[str, dict] = {
    "falcon": {"drop": ("head_dim",)},
    "gpt_neo": {"set": {"attention_types": [[["global", "local"], 1], [["global"], 1]], "num_layers": 3}},
    "mamba2": {"set": {"num_heads": 8, "head_dim": 16, "n_groups": 1, "expand": 2}},
    "rwkv": {"set": {"attention_hidden_size": 64, "intermediate_size": 128}},
    "gpt2": {"set": {"n_positions": 1024}},
    "falcon_h1": {"set": {"mamba_d_ssm": 128}},  # its Mamba width is set apart from mamba_expand · hidden_size
    # DBRX keeps attention and experts in sub-configs (its modeling reads rope_theta from the attention one)
    "dbrx": {"set": {"d_model": 64, "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
                     "ffn_config": {"hidden_size": 64, "ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}}},
    # Funnel counts its layers through block_sizes (it pools the sequence between its blocks)
    "funnel": {"drop": ("num_hidden_layers",), "set": {"block_sizes": [1, 1, 1], "n_head": 4, "d_head": 16,
                                                       "d_inner": 128, "architectures": ["FunnelModel"]}},
}

def encoder_family(model_type: str) -> bool:
    """Masked-LM families are built as encoders (their base model), everything else as a causal LM."""
    from transformers.models.auto import modeling_auto as auto  # lazy: import cost (transformers 1.5 s)

    return (model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
            and model_type not in _CAUSAL_ONLY and (model_type not in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
                                                    or model_type in _ENCODERS))


# Families in both registries: these are encoders first (their causal class needs is_decoder=True).
_ENCODERS = {"bert", "roberta", "camembert", "electra", "ernie", "data2vec-text", "xlm-roberta", "xlm-roberta-xl",
             "roberta-prelayernorm", "rembert", "roc_bert", "roformer", "big_bird", "megatron-bert", "xmod",
             "bert-generation", "xlm"}
_CAUSAL_ONLY: set = set()


def tiny_config(model_type: str, vocab_size: int, pad_token_id: int | None = None, **extra):
    """A small config of ``model_type`` (see :data:`SMALL` and :data:`OVERRIDES`)."""
    from transformers import AutoConfig  # lazy: import cost (transformers 1.5 s)

    try:
        default = AutoConfig.for_model(model_type)
    except (ValueError, KeyError) as exc:
        raise LensInputError(f"unknown transformers model type {model_type!r}: {exc}") from None
    over = OVERRIDES.get(model_type, {})
    text = default.get_text_config() if hasattr(default, "get_text_config") else default
    kw = {k: v for k, v in SMALL.items() if hasattr(text, k) and k not in over.get("drop", ())}
    if hasattr(text, "qk_rope_head_dim"):  # latent attention derives head_dim from its rope / nope split,
        kw.pop("head_dim", None)  # and expands its latent keys and values to every query head
        if "num_key_value_heads" in kw:
            kw["num_key_value_heads"] = kw["num_attention_heads"]
    if hasattr(text, "decoder_layers"):  # decoder-only wrappers of encoder-decoder families
        kw["decoder_layers"] = SMALL["num_hidden_layers"]
    kw.update(over.get("set", {}))
    kw.update(vocab_size=vocab_size, **extra)
    if pad_token_id is not None:
        kw["pad_token_id"] = pad_token_id
    for name in ("bos_token_id", "eos_token_id"):  # default special ids may lie outside a small vocabulary
        v = getattr(text, name, None)
        if isinstance(v, int) and v >= vocab_size:
            kw[name] = 0
    if text is not default:  # multimodal wrappers: the text model takes the sizes
        return AutoConfig.for_model(model_type, text_config={**text.to_dict(), **kw})
    return AutoConfig.for_model(model_type, **kw)


MAX_PARAMS = 40_000_000  # a tiny model is a few million parameters (the packaged 49k vocabulary included)


def _check_size(model_type: str, cls, cfg) -> None:
    """Count the parameters on the meta device first: a family with sizes the small config does not set
    (a byte-level latent model's own vocabularies, say) would otherwise allocate gigabytes."""
    try:
        with torch.device("meta"):
            try:
                shell = cls.from_config(cfg, attn_implementation=cfg._attn_implementation)
            except (TypeError, ValueError):
                shell = cls.from_config(cfg)
    except Exception:  # noqa: BLE001 - the real build below reports the family's own error
        return
    n = sum(p.numel() for p in shell.parameters())
    if n > MAX_PARAMS:
        raise LensInputError(f"cannot build a tiny {model_type!r}: its small config still has {n / 1e6:.0f} M "
                             f"parameters (expected under {MAX_PARAMS / 1e6:.0f} M); some of its sizes are not "
                             "among the ones lens.model.tiny sets")


def build_tiny(model_type: str, attn: str = "eager", **extra):
    """(model, tokenizer) of a tiny random ``model_type`` with a packaged tokenizer."""
    from transformers import AutoModel, AutoModelForCausalLM  # lazy: import cost (transformers 1.5 s)


    if encoder_family(model_type):
        tok = minilm_tokenizer("tiny encoders borrow")
        cls = AutoModel
    else:
        tok = smollm2_tokenizer()
        cls = AutoModelForCausalLM
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    cfg = tiny_config(model_type, len(tok), pad_token_id=pad, **extra)
    cfg._attn_implementation = attn
    _check_size(model_type, cls, cfg)
    torch.manual_seed(SEED)
    try:
        model = cls.from_config(cfg, attn_implementation=attn)
    except (TypeError, ValueError):
        torch.manual_seed(SEED)
        model = cls.from_config(cfg)
    return model, tok


def build_alias(kind: str, attn: str = "eager"):
    """(model, tokenizer) of the fixed tiny models named by alias: ``tiny-bert``, ``tiny-llama`` or ``tiny-gpt2``."""
    from transformers import (  # lazy: import cost (transformers 1.5 s)
        BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM)


    torch.manual_seed(0)
    if kind == "tiny-bert":
        tok = minilm_tokenizer("tiny-bert borrows")
        cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=3,
                         num_attention_heads=4, intermediate_size=128, max_position_embeddings=512,
                         attn_implementation=attn)
        return BertModel(cfg, add_pooling_layer=False), tok
    tok = smollm2_tokenizer()
    if kind == "tiny-llama":
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                          num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=2048, tie_word_embeddings=False,
                          attn_implementation=attn)
        return LlamaForCausalLM(cfg), tok
    cfg = GPT2Config(vocab_size=len(tok), n_embd=64, n_layer=4, n_head=4, n_positions=1024,
                     attn_implementation=attn)
    return GPT2LMHeadModel(cfg), tok
