"""Entry point module: registers GraniteMoeHybridForCausalLM (Granite 4.0 hybrid) and the
Granite 3.x families GraniteForCausalLM (dense) and GraniteMoeForCausalLM. Imports no torch."""
from core_runner.sdk import hookimpl
from core_runner_granite_hybrid.examples import (
    GRANITE_3_1_2B,
    GRANITE_3_1_3B_A800M,
    GRANITE_4_0_H_350M,
    GRANITE_4_0_H_TINY,
)

# the core_runner.sdk versions this plugin is written for: any 1.x (docs/plugin_contract.md)
SDK_RANGE = ">=1.4,<2"  # the standard decoder blocks (SDK 1.4)

CAPABILITIES = {
    "chunked_prefill": "supported",
    # the Triton decode/prefill path reads its request list from fixed device buffers
    # (state rows, flags, query_start_loc) and launches grids sized by the padded batch
    "cuda_graphs": "supported",
    "async_scheduling": "supported",
    # the Mamba layers' row state is kept every mamba_block_size tokens (snapshot slots,
    # model_states.mamba_hybrid), so a hit resumes there with the attention blocks
    "prefix_caching": "supported",
    "triton_attention": "supported",
    "kv_cache_dtype:fp8": "supported",
    # fp8 checkpoints (block weight_block_size; compressed-tensors float-quantized): the
    # core_runner.layers projections keep them resident (docs/quantization.md)
    "quantization:fp8": "supported",
    "quantization:compressed-tensors": "supported",
    # attention and Mamba heads, MLP and expert intermediates, vocabulary split across ranks
    "tensor_parallel": "supported",
    # whole experts per rank (FusedMoE)
    "expert_parallel": "supported",
    # verification keeps the Mamba state after each position and rolls back to the
    # accepted one (docs/hybrid_speculation.md); verification steps run eagerly
    "speculative_decoding": "supported",
}

# mamba_n_groups=1: transformers 5.17 (the GPU image's reference; 5.24 is fixed) ignores the groups
# in its gated RMSNorm; grouped norms are checked in tests/test_granite_hybrid.py where the
# installed reference normalises per group
TINY = dict(
    vocab_size=256, hidden_size=64, num_hidden_layers=4,
    layer_types=["mamba", "attention", "mamba", "mamba"],
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
    mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2,
    mamba_chunk_size=8, shared_intermediate_size=96, intermediate_size=32,
    embedding_multiplier=3.0, attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=2.0,
    initializer_range=0.1, tie_word_embeddings=True,
)

# Granite 3.x: attention-only decoders, so the hybrid's two blockers do not apply
GRANITE_3_CAPABILITIES = {**CAPABILITIES, "prefix_caching": "supported", "speculative_decoding": "supported"}
DENSE_CAPABILITIES = {**GRANITE_3_CAPABILITIES, "expert_parallel": "unsupported"}  # no MoE layers
# what the layers implement: SiLU-gated MLPs and experts (transformers takes any ACT2FN name)
ACCEPTED_CONFIG = {"hidden_act": ["silu"]}

TINY_DENSE = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
    embedding_multiplier=3.0, attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=2.0,
    attention_bias=True, mlp_bias=True, tie_word_embeddings=False, initializer_range=0.1,
)


@hookimpl
def register_models(registry):
    registry.add(
        architecture="GraniteMoeHybridForCausalLM",
        model="core_runner_granite_hybrid.model:GraniteMoeHybridForCausalLM",
        model_state="model_states.mamba_hybrid:MambaHybridModelState",
        capabilities=CAPABILITIES,
        reference="transformers:GraniteMoeHybridForCausalLM",
        sdk_version=SDK_RANGE,
        examples=[
            {"name": "granite-4.0-h-350m-shape", "config": GRANITE_4_0_H_350M},
            {"name": "granite-4.0-h-tiny-shape", "config": GRANITE_4_0_H_TINY},
            {"name": "tiny-dense-nope", "config": {**TINY, "num_local_experts": 0, "position_embedding_type": None}},
            {"name": "tiny-moe-rope", "config": {**TINY, "num_local_experts": 4, "num_experts_per_tok": 2,
                                                 "position_embedding_type": "rope", "tie_word_embeddings": False}},
        ],
    )
    registry.add(
        architecture="GraniteForCausalLM",
        model="core_runner_granite_hybrid.model_dense:GraniteForCausalLM",
        model_state="model_states.default:DefaultModelState",
        capabilities=DENSE_CAPABILITIES,
        accepted_config=ACCEPTED_CONFIG,
        reference="transformers:GraniteForCausalLM",
        sdk_version=SDK_RANGE,
        examples=[
            {"name": "granite-3.1-2b-shape", "config": GRANITE_3_1_2B},
            {"name": "tiny-untied-bias", "config": TINY_DENSE},
        ],
    )
    registry.add(
        architecture="GraniteMoeForCausalLM",
        model="core_runner_granite_hybrid.model_moe:GraniteMoeForCausalLM",
        model_state="model_states.default:DefaultModelState",
        capabilities=GRANITE_3_CAPABILITIES,
        accepted_config=ACCEPTED_CONFIG,
        reference="transformers:GraniteMoeForCausalLM",
        sdk_version=SDK_RANGE,
        examples=[{"name": "granite-3.1-3b-a800m-shape", "config": GRANITE_3_1_3B_A800M}],
    )
