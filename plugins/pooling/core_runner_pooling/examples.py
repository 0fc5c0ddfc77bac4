"""The published config.json of the embedding checkpoints, shrunk in size only, as
conformance examples (published sizes in the comments; EOS / BOS ids left to the suite).
Imports nothing."""

ALL_MINILM_L6_V2 = {  # sentence-transformers/all-MiniLM-L6-v2 (nreimers/MiniLM-L6-H384-uncased)
    "architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": False,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 48,  # 384 (12 heads of 4 instead of 32)
    "initializer_range": 0.02,
    "intermediate_size": 192,  # 1536
    "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
    "num_hidden_layers": 2,  # 6
    "pad_token_id": 0, "position_embedding_type": "absolute", "type_vocab_size": 2, "use_cache": True,
    "vocab_size": 512,  # 30522
}

QWEN3_EMBEDDING_0_6B = {  # Qwen/Qwen3-Embedding-0.6B (served as Qwen3Model, last-token pooling)
    "architectures": ["Qwen3Model"], "attention_bias": False, "attention_dropout": 0.0,
    "head_dim": 32,  # 128
    "hidden_act": "silu",
    "hidden_size": 64,  # 1024
    "intermediate_size": 192,  # 3072
    "max_position_embeddings": 32768, "max_window_layers": 2,  # 28
    "model_type": "qwen3",
    "num_attention_heads": 4,  # 16
    "num_hidden_layers": 2,  # 28
    "num_key_value_heads": 2,  # 8
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "use_cache": True, "use_sliding_window": False,
    "vocab_size": 512,  # 151669
}
