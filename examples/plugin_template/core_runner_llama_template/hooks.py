"""Entry-point module: registers LlamaForCausalLM. Imports no torch and no model code,
so listing plugins stays cheap (the conformance suite checks this, CR-REG-02/03)."""
from core_runner.sdk import hookimpl
from core_runner_llama_template.examples import LLAMA_3_2_1B

# the core_runner.sdk versions this plugin is written for: any 1.x (docs/plugin_contract.md)
SDK_RANGE = ">=1.4,<2"  # the standard decoder blocks (SDK 1.4)

# Tiny configs for the conformance suite: it builds transformers.LlamaForCausalLM from
# each one with random weights and checks this plugin against it.
TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
    rms_norm_eps=1e-5, rope_theta=10000.0,
)


@hookimpl
def register_models(registry):
    registry.add(
        architecture="LlamaForCausalLM",  # config.json "architectures"[0]
        model="core_runner_llama_template.model:LlamaForCausalLM",  # lazy "module:attr"
        model_state="model_states.default:DefaultModelState",  # a plain KV-cache decoder
        capabilities={
            "chunked_prefill": "supported",
            "cuda_graphs": "supported",
            "async_scheduling": "supported",
            "triton_attention": "supported",
            "kv_cache_dtype:fp8": "supported",
            # fp8 checkpoints (block weight_block_size; compressed-tensors float-quantized): the
            # core_runner.layers projections keep them resident (docs/quantization.md)
            "quantization:fp8": "supported",
            "quantization:compressed-tensors": "supported",
            "prefix_caching": "supported",
            # built from the column-/row-parallel layers (model.py), so it splits across ranks
            "tensor_parallel": "supported",
            "expert_parallel": "unsupported",  # dense: no MoE layers
            # rejected proposals' KV slots are simply rewritten: nothing else to roll back
            "speculative_decoding": "supported",
        },
        reference="transformers:LlamaForCausalLM",
        sdk_version=SDK_RANGE,
        examples=[
            {"name": "tiny-gqa", "config": dict(TINY)},
            {"name": "llama-3.2-1b-shape", "config": LLAMA_3_2_1B},
            {"name": "tiny-bias-tied", "config": {**TINY, "num_key_value_heads": 4, "attention_bias": True,
                                                  "mlp_bias": True, "tie_word_embeddings": True}},
            # Llama 3.x scale RoPE by frequency band ('llama3'); get_rope reads any rope type
            {"name": "tiny-llama3-rope", "config": {**TINY, "rope_scaling": {
                "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 128}}},
        ],
    )
