"""The published config.json of Llama-3.2-1B, shrunk in size only, as a conformance example
(llama3 RoPE scaling, tied embeddings, head_dim, GQA ratio kept; published sizes in the
comments; EOS / BOS ids left to the suite). Imports nothing."""

LLAMA_3_2_1B = {  # meta-llama/Llama-3.2-1B
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "head_dim": 16,  # 64
    "hidden_act": "silu",
    "hidden_size": 64,  # 2048
    "initializer_range": 0.02,
    "intermediate_size": 256,  # 8192
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 4,  # 32
    "num_hidden_layers": 2,  # 16
    "num_key_value_heads": 1,  # 8
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "use_cache": True,
    "vocab_size": 512,  # 128256
}
