"""The published config.json of Mistral checkpoints, shrunk in size only, as conformance
examples: every feature field keeps its published value; sizes (widths, layers, heads,
vocabulary, RoPE table length) are cut so the suite runs on a CPU, keeping the ratios that
are features (kv heads below heads, head_dim apart from hidden / heads for Nemo). A
sliding window is a size too: Mistral-7B-v0.1's 4,096 becomes 16 so that the suite's
prompts (a 40-token probe, 4,096-token long requests) run past it. Published values are
in the comments, written from memory of the hub's config.json files (no hub access when
this was written: recheck them against the hub when one is reachable). EOS / BOS ids are
left to the suite (they name tokens of the full vocabulary), and so is initializer_range
(0.02 published; the suite's wider default keeps greedy continuations clear of ties).
Imports nothing.
"""

MISTRAL_7B_V01 = {  # mistralai/Mistral-7B-v0.1
    "architectures": ["MistralForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 64,  # 4096
    "intermediate_size": 224,  # 14336
    "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 4,  # 32
    "num_hidden_layers": 2,  # 32
    "num_key_value_heads": 1,  # 8
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "sliding_window": 16,  # 4096
    "tie_word_embeddings": False, "use_cache": True,
    "vocab_size": 512,  # 32000
}

MISTRAL_NEMO = {  # mistralai/Mistral-Nemo-Base-2407 (Mistral-7B-v0.3 has the same features: no window)
    "architectures": ["MistralForCausalLM"],
    "head_dim": 16,  # 128 (hidden / heads would be 160)
    "hidden_act": "silu",
    "hidden_size": 80,  # 5120
    "intermediate_size": 224,  # 14336
    "max_position_embeddings": 65536,  # 1024000
    "model_type": "mistral",
    "num_attention_heads": 4,  # 32
    "num_hidden_layers": 2,  # 40
    "num_key_value_heads": 2,  # 8
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "use_cache": True,
    "vocab_size": 512,  # 131072
}
