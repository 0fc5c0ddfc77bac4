"""The published config.json of the family's real checkpoints, shrunk in size only, as
conformance examples: every feature field keeps its published value; sizes (widths,
layers, heads, experts, vocabulary) are cut so the suite runs on a CPU, keeping the
ratios that are features (head_dim above hidden / heads, kv heads below heads, experts
per token below experts). Published sizes are in the comments. EOS / BOS ids are left
to the suite (they name tokens of the full vocabulary). Imports nothing.
"""

QWEN3_0_6B = {  # Qwen/Qwen3-0.6B
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "head_dim": 32,  # 128
    "hidden_act": "silu",
    "hidden_size": 64,  # 1024
    "intermediate_size": 192,  # 3072
    "max_position_embeddings": 40960, "max_window_layers": 2,  # 28
    "model_type": "qwen3",
    "num_attention_heads": 4,  # 16
    "num_hidden_layers": 2,  # 28
    "num_key_value_heads": 2,  # 8
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "use_cache": True, "use_sliding_window": False,
    "vocab_size": 512,  # 151936
}

QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "decoder_sparse_step": 1,
    "head_dim": 32,  # 128
    "hidden_act": "silu",
    "hidden_size": 64,  # 2048
    "intermediate_size": 96,  # 6144
    "max_position_embeddings": 40960, "max_window_layers": 2,  # 48
    "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 32,  # 768
    "norm_topk_prob": True,
    "num_attention_heads": 8,  # 32
    "num_experts": 16,  # 128
    "num_experts_per_tok": 4,  # 8
    "num_hidden_layers": 2,  # 48
    "num_key_value_heads": 1,  # 4
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False, "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 512,  # 151936
}
