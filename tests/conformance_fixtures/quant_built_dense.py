"""Broken: every layer built dense, fp8 checkpoints dequantized at load (CR-EQ-18 residency)."""
from conformance_fixtures.corpus import QWEN3, register_as_plugin
from core_runner import hookimpl

QUANT_BUGS = "conformance_fixtures.quant_bugs:"


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3ForCausalLM", QWEN3, model=QUANT_BUGS + "BuiltDense")
