"""Entry point module: registers Mamba2ForCausalLM. Imports no torch."""
from core_runner.sdk import hookimpl
from core_runner_mamba.examples import MAMBA2_130M, MAMBA_CODESTRAL_7B

# SDK 1.2: the "not applicable" capability state and models without paged caches
SDK_RANGE = ">=1.2,<2"

CAPABILITIES = {
    "chunked_prefill": "supported",
    # the Mamba2 mixer's Triton conv / scan read their request list from fixed device
    # buffers (model_states.mamba_hybrid), so steps replay from CUDA graphs
    "cuda_graphs": "supported",
    "async_scheduling": "supported",
    # the row state is kept every mamba_block_size tokens (snapshot slots): a hit resumes
    # there, with no KV block at all
    "prefix_caching": "supported",
    # no attention layer: no attention backend is ever called (the suite checks the claim)
    "triton_attention": "not applicable: attention-free (no attention layer, no paged KV cache)",
    "kv_cache_dtype:fp8": "not applicable: attention-free (no KV cache to store in fp8)",
    # fp8 checkpoints (block weight_block_size; compressed-tensors float-quantized): the
    # core_runner.layers projections keep them resident (docs/quantization.md)
    "quantization:fp8": "supported",
    "quantization:compressed-tensors": "supported",
    # Mamba heads split across ranks, B / C groups split or replicated, vocabulary split
    "tensor_parallel": "supported",
    "expert_parallel": "unsupported",  # no MoE layers
    # verification keeps the state after each position and rolls back to the accepted one
    # (docs/hybrid_speculation.md); verification steps run eagerly
    "speculative_decoding": "supported",
}

# the conv activation is the only activation a Mamba2 mixer has; swish is silu
ACCEPTED = {"hidden_act": ["silu", "swish"]}

TINY = dict(
    vocab_size=256, hidden_size=32, num_heads=8, head_dim=8, expand=2, state_size=16, n_groups=1, conv_kernel=4,
    chunk_size=8, num_hidden_layers=3, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
)


@hookimpl
def register_models(registry):
    registry.add(
        architecture="Mamba2ForCausalLM",
        model="core_runner_mamba.model:Mamba2ForCausalLM",
        model_state="model_states.mamba_hybrid:MambaHybridModelState",
        capabilities=CAPABILITIES,
        reference="transformers:Mamba2ForCausalLM",
        sdk_version=SDK_RANGE,
        accepted_config=ACCEPTED,
        examples=[
            {"name": "mamba2-130m-shape", "config": MAMBA2_130M},
            {"name": "mamba-codestral-7b-shape", "config": MAMBA_CODESTRAL_7B},
            # biases on in_proj / out_proj, no conv bias, dt clamped on both sides
            {"name": "tiny-bias-dt-limit", "config": {**TINY, "use_bias": True, "use_conv_bias": False,
                                                      "time_step_limit": [0.005, 0.05]}},
        ],
    )
