"""Every module-name and config-attribute string the site derivation looks for, in one place.

The derivation (:mod:`lens.model.arch.derive`) reads the model's module tree and a probe forward pass;
names only *rank* candidates (which child is the attention, which the MLP) — what a module *is*
is decided by the data flow the probe observes, so a name never maps a site on its own.
"""

from __future__ import annotations

# Children of a block that compute attention / the MLP. Exact child names first, then fragments of
# class names (``GPT2Attention``, ``MixtralSparseMoeBlock``, ``BloomMLP``).
ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention", "multi_head_attention", "self_att",
                   "linear_attn", "attn_block")
ATTENTION_CLASS_PARTS = ("Attention", "Attn")
MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe", "mlp_block", "ff", "intermediate",
             "output", "shared_mlp")
MLP_CLASS_PARTS = ("MLP", "Mlp", "MoE", "Moe", "FeedForward", "FFN", "Ffn", "Experts", "SparseMoe")
NORM_CLASS_SUFFIXES = ("Norm", "NormGated", "Norm1d")
# Sequence mixers that are neither attention nor an MLP (state-space and recurrent blocks).
MIXER_NAMES = ("mixer", "mamba", "ssm", "conv", "recurrent", "temporal_block", "linear_attn")
MIXER_CLASS_PARTS = ("Mixer", "Mamba", "Ssm", "SSM", "Recurrent", "Rwkv", "ShortConv")

# The child of a mixture-of-experts block whose first output is the router logits (token, n_experts).
ROUTER_NAMES = ("gate", "router")

# Children of the base model that embed positions (learned absolute positions).
POSITION_EMBEDDING_NAMES = ("wpe", "embed_positions", "position_embeddings", "pos_emb", "wpe_emb")
ROTARY_NAMES = ("rotary_emb", "rotary_pos_emb", "rope")

# Config attributes, read through ``config.get_text_config()``.
N_LAYER_ATTRS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
N_EXPERT_ATTRS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_layer")
SOFTCAP_ATTRS = ("final_logit_softcapping", "logits_soft_cap")
# Factors some families apply to the logits (Cohere ``logit_scale`` multiplies, Granite
# ``logits_scaling`` divides, HyperCLOVA X multiplies by the same name, Falcon-H1 ``lm_head_multiplier``).
# Which way each one goes is decided by the probe: the lens must reproduce the model's logits.
LOGIT_SCALE_ATTRS = ("logit_scale", "logits_scaling", "lm_head_multiplier", "output_multiplier_scale")
ALIBI_ATTRS = ("alibi", "use_alibi")
ALIBI_MODEL_TYPES = ("bloom", "mpt")  # ALiBi without a config flag
ROPE_ATTRS = ("rope_theta", "rope_parameters", "rotary_dim", "rotary_pct", "partial_rotary_factor")
EMBED_SCALE_TYPES = {"normalizer", "embed_scale"}  # attributes holding Gemma's √d scale on the base model
