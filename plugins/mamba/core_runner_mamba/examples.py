"""Published Mamba2 config.json files, shrunk in size only, as conformance examples: every
feature field keeps its published value (n_groups, tied or untied head, biases, dt limit,
residual in fp32); sizes are cut so the suite runs on a CPU (published sizes in the
comments). Field values written from knowledge of the hub files, without hub access:
recheck them against the hub when one is reachable. EOS / BOS / PAD ids are left to the
suite. Imports nothing.

Mamba2Config has no max_position_embeddings: the recurrence has no position limit.
"""

_COMMON = {
    "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "conv_kernel": 4, "expand": 2,
    "hidden_act": "silu", "layer_norm_epsilon": 1e-05, "rescale_prenorm_residual": False, "residual_in_fp32": True,
    "time_step_floor": 0.0001, "time_step_limit": [0.0, float("inf")], "time_step_max": 0.1, "time_step_min": 0.001,
    "use_bias": False, "use_conv_bias": True,
    "chunk_size": 8,  # 256: chunk ends inside the suite's prompts
    "head_dim": 8,  # 64
    "state_size": 16,  # 128
    "num_hidden_layers": 2,
}

# state-spaces/mamba2-130m (transformers format, as converted to Mamba2ForCausalLM)
MAMBA2_130M = {
    **_COMMON,
    "hidden_size": 32,  # 768
    "num_heads": 8,  # 24 (= 2 x 768 / 64)
    "n_groups": 1,
    "tie_word_embeddings": True,
    "vocab_size": 512,  # 50288 (50277 padded to a multiple of 16)
    "time_step_rank": 2,  # 48 (= hidden / 16; unused by the forward)
}

# mistralai/Mamba-Codestral-7B-v0.1: 8 groups of B/C, untied head. transformers 5.17's
# gated RMSNorm ignores the groups (normalising all of d_inner, unlike mamba_ssm and 5.24+):
# with it as the reference this example's logits differ (the engine follows mamba_ssm)
MAMBA_CODESTRAL_7B = {
    **_COMMON,
    "hidden_size": 32,  # 4096
    "num_heads": 8,  # 128
    "n_groups": 8,
    "tie_word_embeddings": False,
    "vocab_size": 512,  # 32768
    "time_step_rank": 2,  # 256
}
