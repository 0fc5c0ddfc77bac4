"""Shared building blocks that plugins assemble into models."""
from core_runner.layers.activation import SiluAndMul
from core_runner.layers.attention import Attention
from core_runner.layers.embedding import LMHead, VocabEmbedding
from core_runner.layers.linear import Linear, MergedLinear, QKVLinear
from core_runner.layers.norm import RMSNorm
from core_runner.layers.rope_config import yarn_softmax_scale
from core_runner.layers.rotary import RotaryEmbedding, get_rope, rope_theta_of

__all__ = [
    "Attention", "LMHead", "Linear", "MergedLinear", "QKVLinear", "RMSNorm",
    "RotaryEmbedding", "SiluAndMul", "VocabEmbedding", "get_rope", "rope_theta_of", "yarn_softmax_scale",
]
