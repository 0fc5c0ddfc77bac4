"""Shared building blocks that plugins assemble into models.

Every public layer and helper is exported here; each one's docstring says what it
computes and returns. Parameters carry ``weight_loader(param, tensor, shard_id=None)``
(see ``default_weight_loader`` and README "Writing a plugin" for the loading hooks)."""
from core_runner.distributed import (
    divide,
    expert_parallel_enabled,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from core_runner.layers.activation import GATED_ACTIVATIONS, GeluAndMul, SiluAndMul, act_and_mul
from core_runner.layers.attention import Attention
from core_runner.layers.causal_lm import QKV_GATE_UP_PACKED, CausalLM
from core_runner.layers.decoder_attention import DecoderAttention
from core_runner.layers.decoder_stack import (
    AuxHiddenStates,
    DecoderStack,
    PreNormDecoderLayer,
    check_aux_layers,
    eagle3_default_layers,
)
from core_runner.layers.embedding import LMHead, ParallelLMHead, VocabEmbedding, VocabParallelEmbedding
from core_runner.layers.fp8_weight import dense_weight, is_fp8
from core_runner.layers.fused_moe import (
    FusedMoE,
    expert_packed_mapping,
    fused_moe_ref,
    stacked_expert_name,
    swigluoai_ref,
)
from core_runner.layers.fused_moe_fp8 import fused_moe_fp8_ref, quant_dequant_rows
from core_runner.layers.gelu import GELU, gelu_from_name
from core_runner.layers.layernorm import LayerNorm
from core_runner.layers.linear import (
    ColumnParallelLinear,
    Linear,
    MergedColumnParallelLinear,
    MergedLinear,
    QKVLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    check_head_split,
    copy_into,
    default_weight_loader,
    materialize,
)
from core_runner.layers.mamba2 import DepthwiseConv1d, GatedRMSNorm, Mamba2Mixer
from core_runner.layers.mla import MLAAttention
from core_runner.layers.mlp import GatedMLP
from core_runner.layers.moe_routing import check_expert_groups, grouped_topk_v2, grouped_topk_v3, softmax_topk
from core_runner.layers.norm import GemmaRMSNorm, RMSNorm
from core_runner.layers.rope_config import (
    cos_sin_of,
    default_inv_freq,
    rope_cos_sin_table,
    rope_parameters_of,
    yarn_get_mscale,
    yarn_softmax_scale,
)
from core_runner.layers.rotary import RotaryEmbedding, get_rope, rope_theta_of

__all__ = [
    "check_head_split", "dense_weight", "is_fp8", "ColumnParallelLinear", "copy_into", "divide",
    "expert_parallel_enabled",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size", "materialize", "MergedColumnParallelLinear", "ParallelLMHead",
    "QKVParallelLinear", "ReplicatedLinear", "RowParallelLinear", "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce", "VocabParallelEmbedding",
    "act_and_mul", "Attention", "cos_sin_of", "default_inv_freq", "default_weight_loader", "DepthwiseConv1d",
    "expert_packed_mapping", "fused_moe_fp8_ref", "fused_moe_ref", "FusedMoE", "GATED_ACTIVATIONS", "GatedMLP",
    "GatedRMSNorm", "GELU",
    "GeluAndMul", "GemmaRMSNorm", "gelu_from_name", "get_rope",
    "check_expert_groups", "grouped_topk_v2", "grouped_topk_v3", "LayerNorm", "Linear", "LMHead", "Mamba2Mixer",
    "MergedLinear",
    "MLAAttention", "QKVLinear", "RMSNorm", "rope_cos_sin_table", "rope_parameters_of", "rope_theta_of",
    "RotaryEmbedding", "SiluAndMul", "softmax_topk", "stacked_expert_name", "swigluoai_ref", "VocabEmbedding",
    "yarn_get_mscale", "yarn_softmax_scale",
    "AuxHiddenStates", "check_aux_layers", "DecoderAttention", "DecoderStack", "eagle3_default_layers",
    "PreNormDecoderLayer", "CausalLM", "QKV_GATE_UP_PACKED", "quant_dequant_rows",
]
