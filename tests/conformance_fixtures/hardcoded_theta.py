"""Broken: the RoPE base is 10,000 whatever rope_theta says (CR-EQ-12)."""
from conformance_fixtures import QWEN3_BUGS, register_qwen3
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_qwen3(registry, QWEN3_BUGS + "HardcodedTheta")
