"""Broken: the RoPE table stops at 2,048 positions (CR-EQ-13)."""
from conformance_fixtures import QWEN3_BUGS, register_qwen3
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_qwen3(registry, QWEN3_BUGS + "RopeCutAt2048")
