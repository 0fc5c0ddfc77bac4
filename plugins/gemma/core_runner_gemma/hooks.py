"""Entry point module: registers Gemma2ForCausalLM and Gemma3ForCausalLM (text). Imports
no torch."""
from core_runner.sdk import hookimpl
from core_runner_gemma.examples import GEMMA_2_2B, GEMMA_3_1B_PT

# the core_runner.sdk versions this plugin is written for: 1.1 added GemmaRMSNorm, GeluAndMul
# and Attention's sliding_window / logits_soft_cap options
SDK_RANGE = ">=1.4,<2"  # the standard decoder blocks (SDK 1.4), check_head_split (1.2), attention options (1.1)

CAPABILITIES = {
    "chunked_prefill": "supported",
    "cuda_graphs": "supported",
    "async_scheduling": "supported",
    # windows only mask: every block stays in the table, so a prefix hit finds the window's blocks
    "prefix_caching": "supported",
    "triton_attention": "supported",
    "kv_cache_dtype:fp8": "supported",
    # fp8 checkpoints (block weight_block_size; compressed-tensors float-quantized): the
    # core_runner.layers projections keep them resident (docs/quantization.md)
    "quantization:fp8": "supported",
    "quantization:compressed-tensors": "supported",
    "tensor_parallel": "supported",
    "expert_parallel": "unsupported",  # dense: no MoE layers
    "speculative_decoding": "supported",
}
# what the model implements:
# - hidden_activation: the gated MLP matches transformers exactly for these (core_runner.layers.GATED_ACTIVATIONS);
# - use_bidirectional_attention (EmbeddingGemma-style encoders): a causal decoder only;
GEMMA2_ACCEPTED = {
    "hidden_activation": ["gelu_pytorch_tanh", "gelu", "silu", "swish"],
    "use_bidirectional_attention": [None, False],
}
# - Gemma3 attn_logit_softcapping: transformers' Gemma3 reads it but never hands it to its
#   attention, so what a non-null value means is undefined; published Gemma 3 configs say null
GEMMA3_ACCEPTED = {**GEMMA2_ACCEPTED, "attn_logit_softcapping": [None]}

TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, max_position_embeddings=512, rms_norm_eps=1e-6,
    sliding_window=8,
)


@hookimpl
def register_models(registry):
    registry.add(
        architecture="Gemma2ForCausalLM",
        model="core_runner_gemma.model:Gemma2ForCausalLM",
        model_state="model_states.default:DefaultModelState",
        capabilities=CAPABILITIES,
        accepted_config=GEMMA2_ACCEPTED,
        reference="transformers:Gemma2ForCausalLM",
        sdk_version=SDK_RANGE,
        examples=[
            {"name": "gemma-2-2b-shape", "config": GEMMA_2_2B},
            # full layer first, untied head, biases, soft caps the published ones are not
            {"name": "tiny-untied-bias", "config": {
                **TINY, "layer_types": ["full_attention", "sliding_attention"], "tie_word_embeddings": False,
                "attention_bias": True, "attn_logit_softcapping": 5.0, "final_logit_softcapping": 2.0,
                "rope_theta": 1000.0, "attn_implementation": "eager"}},
        ],
    )
    registry.add(
        architecture="Gemma3ForCausalLM",
        model="core_runner_gemma.model:Gemma3ForCausalLM",
        model_state="model_states.default:DefaultModelState",
        capabilities=CAPABILITIES,
        accepted_config=GEMMA3_ACCEPTED,
        reference="transformers:Gemma3ForCausalLM",
        sdk_version=SDK_RANGE,
        examples=[
            {"name": "gemma-3-1b-pt-shape", "config": GEMMA_3_1B_PT},
            # transformers 5's per-layer-type rope_parameters; linear scaling of the global layers as
            # gemma-3-4b and larger publish it; a final soft cap
            {"name": "tiny-linear-rope", "config": {
                **TINY, "layer_types": ["sliding_attention", "full_attention"], "final_logit_softcapping": 3.0,
                "rope_parameters": {
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}},
        ],
    )
