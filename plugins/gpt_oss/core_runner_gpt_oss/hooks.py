"""Entry point module: registers GptOssForCausalLM. Imports no torch.

Refused by name (never run as something else): MXFP4 checkpoints (the published gpt-oss
experts; ``quantization_config.quant_method="mxfp4"``): core-runner has no MXFP4 matmul
kernel, so they are refused when the config is parsed (``core_runner.quantization``);
dequantizing them to bf16 at load is possible later. bf16 / fp16 / fp32 checkpoints load.
A ``layer_types`` entry other than sliding / full attention, or a sliding layer without a
window, is a ValueError naming the field when the model is built.
"""
from core_runner.sdk import hookimpl
from core_runner_gpt_oss.examples import GPT_OSS_20B

# the core_runner.sdk versions this plugin is written for: any 1.x (docs/plugin_contract.md)
SDK_RANGE = ">=1.4,<2"  # the standard decoder blocks (SDK 1.4), check_head_split (1.2), attention options (1.1)

CAPABILITIES = {
    "chunked_prefill": "supported",
    "cuda_graphs": "supported",
    "async_scheduling": "supported",
    "prefix_caching": "supported",
    "triton_attention": "supported",
    "kv_cache_dtype:fp8": "supported",
    # fp8 checkpoints (block weight_block_size; compressed-tensors float-quantized): the
    # core_runner.layers projections keep them resident (docs/quantization.md)
    "quantization:fp8": "supported",
    "quantization:compressed-tensors": "supported",
    # heads (with their sinks), expert intermediates (with their biases), vocabulary
    "tensor_parallel": "supported",
    # whole experts (and their biases) per rank: FusedMoE's expert parallelism
    "expert_parallel": "supported",
    "speculative_decoding": "supported",
}

# a small window, so that the suite's 40-token probes run past it on the sliding layers;
# default RoPE keeps CR-EQ-13 at 4,096 positions (the published example covers YaRN)
TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
    layer_types=["sliding_attention", "full_attention"], sliding_window=8,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, num_local_experts=8, num_experts_per_tok=2,
    tie_word_embeddings=True,
)


@hookimpl
def register_models(registry):
    registry.add(
        architecture="GptOssForCausalLM",
        model="core_runner_gpt_oss.model:GptOssForCausalLM",
        model_state="model_states.default:DefaultModelState",
        capabilities=CAPABILITIES,
        reference="transformers:GptOssForCausalLM",
        sdk_version=SDK_RANGE,
        examples=[
            {"name": "tiny-window8", "config": TINY},
            {"name": "gpt-oss-20b-shape", "config": GPT_OSS_20B},
        ],
    )
