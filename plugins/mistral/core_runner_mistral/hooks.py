"""Entry point module: registers MistralForCausalLM. Imports no torch."""
from core_runner.sdk import hookimpl
from core_runner_mistral.examples import MISTRAL_7B_V01, MISTRAL_NEMO

# the core_runner.sdk versions this plugin is written for: 1.1 added GeluAndMul / act_and_mul
SDK_RANGE = ">=1.4,<2"  # the standard decoder blocks (SDK 1.4), check_head_split (1.2), attention options (1.1)

CAPABILITIES = {
    "chunked_prefill": "supported",
    "cuda_graphs": "supported",
    "async_scheduling": "supported",
    # the window only masks: every block stays in the table, so a prefix hit finds the window's blocks
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
# the gated MLP computes exactly these transformers activations (core_runner.layers.GATED_ACTIVATIONS)
ACCEPTED_CONFIG = {"hidden_act": ["silu", "swish", "gelu", "gelu_pytorch_tanh"]}


@hookimpl
def register_models(registry):
    registry.add(
        architecture="MistralForCausalLM",
        model="core_runner_mistral.model:MistralForCausalLM",
        model_state="model_states.default:DefaultModelState",
        capabilities=CAPABILITIES,
        accepted_config=ACCEPTED_CONFIG,
        reference="transformers:MistralForCausalLM",
        sdk_version=SDK_RANGE,
        examples=[
            {"name": "mistral-7b-v0.1-shape", "config": MISTRAL_7B_V01},
            {"name": "mistral-nemo-shape", "config": MISTRAL_NEMO},
        ],
    )
