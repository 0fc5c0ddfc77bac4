"""The published config.json of IBM's granite-4.0-h and granite-3.1 checkpoints, shrunk in size only, as
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


# Granite 3.x (GraniteForCausalLM / GraniteMoeForCausalLM): config.json field values written
# from memory of the hub (no hub access here); recheck against the hub when it is reachable.
# Published sizes in the comments.
_GRANITE_3 = {
    "attention_bias": False, "attention_dropout": 0.1,
    "attention_multiplier": 0.015625,  # 1 / head_dim (64)
    "embedding_multiplier": 12.0, "hidden_act": "silu", "logits_scaling": 8.0,
    "max_position_embeddings": 131072, "residual_multiplier": 0.22, "rms_norm_eps": 1e-05,
    "rope_scaling": None, "rope_theta": 5000000.0, "tie_word_embeddings": True,
    "hidden_size": 64,  # 2048
    "num_attention_heads": 4,  # 32
    "num_key_value_heads": 2,  # 8
    "num_hidden_layers": 2,  # 40
    "vocab_size": 512,  # 49155
}

GRANITE_3_1_2B = {  # ibm-granite/granite-3.1-2b-instruct: dense
    **_GRANITE_3, "architectures": ["GraniteForCausalLM"], "model_type": "granite", "mlp_bias": False,
    "intermediate_size": 128,  # 8192
}

GRANITE_3_1_3B_A800M = {  # ibm-granite/granite-3.1-3b-a800m-instruct: MoE, 40 experts, top-8
    **_GRANITE_3, "architectures": ["GraniteMoeForCausalLM"], "model_type": "granitemoe",
    "attention_dropout": 0.0, "logits_scaling": 6.0, "rms_norm_eps": 1e-06, "rope_theta": 10000000.0,
    "num_attention_heads": 4,  # 24 (head_dim 64)
    "intermediate_size": 32,  # 512 per expert
    "num_local_experts": 8,  # 40
    "num_experts_per_tok": 4,  # 8
    "output_router_logits": False, "router_aux_loss_coef": 0.0,
}
