"""The published config.json of IBM's granite-4.0-h checkpoints, shrunk in size only, as
conformance examples: every feature field (NoPE attention, the multipliers, Mamba2 conv and
projection biases, shared experts) keeps its published value; sizes are cut so the suite
runs on a CPU (published sizes in the comments; the attention / Mamba layer mix is kept
as a short pattern). EOS / BOS / PAD ids are left to the suite. Imports nothing.
"""

_COMMON = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attention_multiplier": 0.0078125, "embedding_multiplier": 12, "hidden_act": "silu",
    "layer_types": ["mamba", "attention", "mamba", "mamba"],  # 40 / 32 layers, attention every few
    "logits_scaling": 6,
    "mamba_chunk_size": 8,  # 256
    "mamba_conv_bias": True, "mamba_d_conv": 4,
    "mamba_d_head": 16,  # 64 / 32
    "mamba_d_state": 16,  # 128
    "mamba_expand": 2, "mamba_n_groups": 1,
    "mamba_n_heads": 8,  # 48
    "mamba_proj_bias": False, "max_position_embeddings": 131072, "model_type": "granitemoehybrid",
    "normalization_function": "rmsnorm",
    "num_attention_heads": 4,  # 12
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,  # 4
    "output_router_logits": False, "position_embedding_type": "nope", "residual_multiplier": 0.22,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000, "router_aux_loss_coef": 0.0,
    "tie_word_embeddings": True,
    "hidden_size": 64,  # 1536 / 768
    "vocab_size": 512,  # 100352
}

GRANITE_4_0_H_TINY = {  # ibm-granite/granite-4.0-h-tiny: MoE
    **_COMMON,
    "intermediate_size": 32,  # 512
    "num_experts_per_tok": 2,  # 6
    "num_local_experts": 8,  # 64
    "shared_intermediate_size": 48,  # 1024
}

GRANITE_4_0_H_350M = {  # ibm-granite/granite-4.0-h-350m: dense (no routed experts)
    **_COMMON,
    "intermediate_size": 32,  # 2048
    "num_experts_per_tok": 0, "num_local_experts": 0,
    "shared_intermediate_size": 96,  # 2048
}
