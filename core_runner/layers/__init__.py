"""Shared building blocks that plugins assemble into models.

Every public layer and helper is exported here; each one's docstring says what it
computes and returns. Parameters carry ``weight_loader(param, tensor, shard_id=None)``
(see ``default_weight_loader`` and README "Writing a plugin" for the loading hooks)."""
from core_runner.layers.activation import SiluAndMul
from core_runner.layers.attention import Attention
from core_runner.layers.embedding import LMHead, VocabEmbedding
from core_runner.layers.fused_moe import FusedMoE, expert_packed_mapping, fused_moe_ref
from core_runner.layers.gelu import GELU, gelu_from_name
from core_runner.layers.layernorm import LayerNorm
from core_runner.layers.linear import Linear, MergedLinear, QKVLinear, default_weight_loader
from core_runner.layers.mamba2 import DepthwiseConv1d, GatedRMSNorm, Mamba2Mixer
from core_runner.layers.mla import MLAAttention
from core_runner.layers.moe_routing import grouped_topk_v2, grouped_topk_v3, softmax_topk
from core_runner.layers.norm import RMSNorm
from core_runner.layers.rope_config import yarn_softmax_scale
from core_runner.layers.rotary import RotaryEmbedding, get_rope, rope_theta_of

__all__ = [
    "GELU", "Attention", "DepthwiseConv1d", "FusedMoE", "GatedRMSNorm", "LMHead", "LayerNorm", "Linear",
    "MLAAttention", "Mamba2Mixer", "MergedLinear", "QKVLinear", "RMSNorm", "RotaryEmbedding", "SiluAndMul",
    "VocabEmbedding", "default_weight_loader", "expert_packed_mapping", "fused_moe_ref", "gelu_from_name", "get_rope",
    "grouped_topk_v2", "grouped_topk_v3", "rope_theta_of", "softmax_topk", "yarn_softmax_scale",
]
