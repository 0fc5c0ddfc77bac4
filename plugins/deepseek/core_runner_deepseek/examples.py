"""The published config.json of DeepSeek-V2-Lite and DeepSeek-V3, shrunk in size only, as
conformance examples: every feature field (YaRN RoPE with its mscale, MLA ranks, routing
method, group-limited top-k, scaling factor, fp8 block quantization) keeps its published
value; sizes are cut so the suite runs on a CPU. V2-Lite's published dict is kept whole
(the bench checkpoint is built from it) and cut by ``V2_LITE_CPU_SIZES``; V3's published
sizes are in the comments (its fp8 block shrinks with the widths so that several blocks,
and partial ones, are exercised). EOS / BOS ids are left to the suite. Imports nothing.
"""

DEEPSEEK_V2_LITE_PUBLISHED = {  # deepseek-ai/DeepSeek-V2-Lite, at its published sizes
    "architectures": ["DeepseekV2ForCausalLM"], "aux_loss_alpha": 0.001, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
    "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False,
    "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128,
    "vocab_size": 102400,
}
# the sizes cut for the CPU example (core_runner_deepseek.bench uses the published dict uncut)
V2_LITE_CPU_SIZES = {
    "hidden_size": 64, "intermediate_size": 128, "kv_lora_rank": 32, "moe_intermediate_size": 24,
    "n_routed_experts": 8, "num_attention_heads": 4, "num_experts_per_tok": 3, "num_hidden_layers": 2,
    "num_key_value_heads": 4, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "vocab_size": 512,
}
# its own rope dict: transformers' config class writes rope_type / rope_theta into the one it is given
DEEPSEEK_V2_LITE = {**DEEPSEEK_V2_LITE_PUBLISHED, "rope_scaling": dict(DEEPSEEK_V2_LITE_PUBLISHED["rope_scaling"]),
                    **V2_LITE_CPU_SIZES}

DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 (fp8 weights)
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False,
    "first_k_dense_replace": 1,  # 3
    "hidden_act": "silu",
    "hidden_size": 64,  # 7168
    "intermediate_size": 128,  # 18432
    "kv_lora_rank": 32,  # 512
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 64,  # 2048 (per rank at TP=2 still a multiple of the scaled block 16, as 2048 of 128)
    "moe_layer_freq": 1, "n_group": 8,
    "n_routed_experts": 16,  # 256
    "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 4,  # 128
    "num_experts_per_tok": 8,
    "num_hidden_layers": 2,  # 61
    "num_key_value_heads": 4,  # 128
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 48,  # 1536
    "qk_nope_head_dim": 16,  # 128
    "qk_rope_head_dim": 8,  # 64
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [16, 16]},  # [128, 128]
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 4, "topk_method": "noaux_tc",
    "v_head_dim": 16,  # 128
    "vocab_size": 512,  # 129280
}
