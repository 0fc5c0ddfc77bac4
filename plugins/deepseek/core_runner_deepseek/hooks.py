"""Entry point module: registers the DeepSeek architectures. Imports no torch."""
from core_runner.sdk import hookimpl
from core_runner_deepseek.examples import DEEPSEEK_V2_LITE, DEEPSEEK_V3

# the core_runner.sdk versions this plugin is written for: any 1.x (docs/plugin_contract.md)
SDK_RANGE = ">=1.4,<2"  # the standard decoder blocks (1.4), quantized= on kv_b_proj (1.3)

CAPABILITIES = {
    "chunked_prefill": "supported",
    # MLA write/attend, routing and the fused MoE use device ops only (no host reads,
    # grids from host ints), so a step can be captured
    "cuda_graphs": "supported",
    "async_scheduling": "supported",
    # the latent cache is paged like any KV cache: its blocks are shared like theirs
    "prefix_caching": "supported",
    "triton_attention": "supported",
    "kv_cache_dtype:fp8": "supported",
    # DeepSeek-V3's own block-fp8 checkpoints: projections and experts resident fp8, kv_b_proj dense
    "quantization:fp8": "supported",
    # compressed-tensors float-quantized (llm-compressor FP8 / FP8_DYNAMIC, per tensor or channel)
    "quantization:compressed-tensors": "supported",
    # MLA heads, the dense / shared MLPs and the vocabulary split across ranks (the latent
    # cache replicated); the routed experts split or distributed by FusedMoE
    "tensor_parallel": "supported",
    "expert_parallel": "supported",
    "speculative_decoding": "supported",
}

TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16,
    qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
    first_k_dense_replace=1, max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.12,
    tie_word_embeddings=False,
)
TINY_V2 = {**TINY, "topk_method": "greedy", "routed_scaling_factor": 1.0}
TINY_V3 = {**TINY, "n_group": 4, "topk_group": 2, "norm_topk_prob": True, "routed_scaling_factor": 2.5}


@hookimpl
def register_models(registry):
    registry.add(
        architecture="DeepseekV2ForCausalLM",
        model="core_runner_deepseek.model:DeepseekV2ForCausalLM",
        model_state="model_states.default:DefaultModelState",
        capabilities=CAPABILITIES,
        reference="transformers:DeepseekV2ForCausalLM",
        sdk_version=SDK_RANGE,
        examples=[
            {"name": "tiny-greedy-qlora", "config": TINY_V2},
            {"name": "deepseek-v2-lite-shape", "config": DEEPSEEK_V2_LITE},
            {"name": "tiny-group-limited", "config": {**TINY_V2, "topk_method": "group_limited_greedy",
                                                      "n_group": 4, "topk_group": 2, "q_lora_rank": None,
                                                      "routed_scaling_factor": 1.5}},
        ],
    )
    registry.add(
        architecture="DeepseekV3ForCausalLM",
        model="core_runner_deepseek.model:DeepseekV3ForCausalLM",
        model_state="model_states.default:DefaultModelState",
        capabilities=CAPABILITIES,
        reference="transformers:DeepseekV3ForCausalLM",
        sdk_version=SDK_RANGE,
        examples=[{"name": "tiny", "config": TINY_V3}, {"name": "deepseek-v3-fp8-shape", "config": DEEPSEEK_V3}],
    )
    # the checkpoint's own next-token-prediction layers (num_nextn_predict_layers); V2
    # checkpoints have none
    registry.add_draft(architecture="DeepseekV3ForCausalLM", method="mtp", model="core_runner_deepseek.mtp:DeepSeekMTP",
                       sdk_version=SDK_RANGE)
