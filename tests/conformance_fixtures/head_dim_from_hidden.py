"""Broken: head_dim is hidden_size / num_attention_heads, not the config's (CR-EQ-12)."""
from conformance_fixtures import QWEN3_BUGS, register_qwen3
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_qwen3(registry, QWEN3_BUGS + "HeadDimFromHidden")
