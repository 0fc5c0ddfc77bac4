"""Entry point module: registers the Qwen3 architectures and the EAGLE / EAGLE-3 draft
models (``core_runner_qwen3.eagle`` says why those live here). Imports no torch."""
from core_runner.sdk import hookimpl
from core_runner_qwen3.examples import QWEN3_0_6B, QWEN3_30B_A3B

# the core_runner.sdk versions this plugin is written for: any 1.x (docs/plugin_contract.md)
SDK_RANGE = ">=1.4,<2"  # the standard decoder blocks (SDK 1.4), check_head_split (1.2), attention options (1.1)

CAPABILITIES = {
    "chunked_prefill": "supported",
    "cuda_graphs": "supported",
    "async_scheduling": "supported",
    "prefix_caching": "supported",
    "triton_attention": "supported",
    "kv_cache_dtype:fp8": "supported",
    "tensor_parallel": "supported",
    "expert_parallel": "unsupported",  # no MoE layers
    "speculative_decoding": "supported",
    # Qwen3-*-FP8 (block [128, 128]): fp8 weights resident in the linear layers and experts
    "quantization:fp8": "supported",
    # compressed-tensors float-quantized (llm-compressor FP8 / FP8_DYNAMIC, per tensor or channel)
    "quantization:compressed-tensors": "supported",
}
MOE_CAPABILITIES = {**CAPABILITIES, "expert_parallel": "supported"}
# what the layers implement: SiLU-gated MLPs only
ACCEPTED_CONFIG = {"hidden_act": ["silu"]}

TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
    rms_norm_eps=1e-6, rope_theta=10000.0,
)


TINY_MOE = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
    rms_norm_eps=1e-6, rope_theta=10000.0, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
    decoder_sparse_step=1, mlp_only_layers=[1], tie_word_embeddings=False, initializer_range=0.12,
)


# (the draft checkpoint's architectures[0], method) -> draft class. EAGLE-1 checkpoints say
# "LlamaForCausalLM" (their config is a one-layer Llama's); EAGLE-3 ones say
# "LlamaForCausalLMEagle3", some "Eagle3LlamaForCausalLM" or plain "LlamaForCausalLM".
EAGLE_DRAFTS = (
    ("LlamaForCausalLM", "eagle", "EagleLlamaForCausalLM"),
    ("EagleLlamaForCausalLM", "eagle", "EagleLlamaForCausalLM"),
    ("LlamaForCausalLMEagle", "eagle", "EagleLlamaForCausalLM"),
    ("LlamaForCausalLMEagle3", "eagle3", "Eagle3LlamaForCausalLM"),
    ("Eagle3LlamaForCausalLM", "eagle3", "Eagle3LlamaForCausalLM"),
    ("LlamaForCausalLM", "eagle3", "Eagle3LlamaForCausalLM"),
)


@hookimpl
def register_models(registry):
    registry.add(
        architecture="Qwen3ForCausalLM",
        model="core_runner_qwen3.model:Qwen3ForCausalLM",
        model_state="model_states.default:DefaultModelState",
        capabilities=CAPABILITIES,
        accepted_config=ACCEPTED_CONFIG,
        reference="transformers:Qwen3ForCausalLM",
        sdk_version=SDK_RANGE,
        examples=[
            {"name": "tiny-untied", "config": {**TINY, "tie_word_embeddings": False}},
            # layer 1 attends over a window of 8 (Qwen3's use_sliding_window from max_window_layers on)
            {"name": "tiny-tied", "config": {**TINY, "tie_word_embeddings": True, "num_key_value_heads": 4,
                                             "use_sliding_window": True, "sliding_window": 8,
                                             "max_window_layers": 1}},
            {"name": "qwen3-0.6b-shape", "config": QWEN3_0_6B},
            # Qwen/Qwen3-0.6B-FP8: the same shape, weight_block_size scaled with it (128 -> 16)
            {"name": "qwen3-0.6b-fp8-shape", "config": {**QWEN3_0_6B, "quantization_config": {
                "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [16, 16]}}},
        ],
    )
    registry.add(
        architecture="Qwen3MoeForCausalLM",
        model="core_runner_qwen3.model_moe:Qwen3MoeForCausalLM",
        model_state="model_states.default:DefaultModelState",
        capabilities=MOE_CAPABILITIES,
        accepted_config=ACCEPTED_CONFIG,
        reference="transformers:Qwen3MoeForCausalLM",
        sdk_version=SDK_RANGE,
        examples=[{"name": "tiny-moe", "config": TINY_MOE}, {"name": "qwen3-30b-a3b-shape", "config": QWEN3_30B_A3B}],
    )
    for architecture, method, cls in EAGLE_DRAFTS:
        registry.add_draft(architecture, method, f"core_runner_qwen3.eagle:{cls}", sdk_version=SDK_RANGE)
