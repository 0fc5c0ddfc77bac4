"""The published config.json of Gemma checkpoints, shrunk in size only, as conformance
examples: every feature field keeps its published value; sizes (widths, layers, heads,
vocabulary) are cut so the suite runs on a CPU, keeping the ratios that are features
(head_dim apart from hidden / heads, kv heads below heads, query_pre_attn_scalar equal to
head_dim as published). A sliding window is a size too: 4,096 / 512 become 16 so that the
suite's prompts (a 40-token probe, 4,096-token long requests) run past it. Published
values are in the comments, written from memory of the hub's config.json files (no hub
access when this was written: recheck them against the hub when one is reachable). EOS /
BOS / PAD ids are left to the suite (they name tokens of the full vocabulary). Imports
nothing.

``attn_implementation="eager"`` is not a checkpoint field (transformers does not save it):
it picks the reference's attention. transformers before 5.2x builds Gemma2 with SDPA,
which drops ``attn_logit_softcapping`` silently; its eager attention applies it, as the
model is defined. Later releases refuse SDPA for Gemma2 and choose eager themselves.
"""

GEMMA_2_2B = {  # google/gemma-2-2b
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    "head_dim": 16,  # 256 (hidden / heads would be 288)
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 72,  # 2304
    "intermediate_size": 288,  # 9216
    "max_position_embeddings": 8192, "model_type": "gemma2",
    "num_attention_heads": 4,  # 8
    "num_hidden_layers": 2,  # 26 (alternating sliding / full, from the config's default)
    "num_key_value_heads": 2,  # 4
    "query_pre_attn_scalar": 16,  # 256 (= head_dim)
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 16,  # 4096
    "use_cache": True,
    "vocab_size": 512,  # 256000
    "attn_implementation": "eager",  # the reference's attention (module docstring)
}

GEMMA_3_1B_PT = {  # google/gemma-3-1b-pt (Gemma3ForCausalLM, text only)
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "final_logit_softcapping": None,
    "head_dim": 16,  # 256 (hidden / heads would be 288)
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 72,  # 1152
    "intermediate_size": 432,  # 6912
    "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4,  # 4
    "num_hidden_layers": 6,  # 26 (six keep one full-attention layer of the pattern)
    "num_key_value_heads": 1,  # 1
    "query_pre_attn_scalar": 16,  # 256 (= head_dim)
    "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None, "rope_theta": 1000000.0,
    "sliding_window": 16,  # 512
    "sliding_window_pattern": 6, "use_cache": True,
    "vocab_size": 512,  # 262144
}
