"""Broken: o_proj loads its fp8 block scales transposed (CR-EQ-18, quantization:fp8)."""
from conformance_fixtures.corpus import QWEN3, register_as_plugin
from core_runner import hookimpl

QUANT_BUGS = "conformance_fixtures.quant_bugs:"


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3ForCausalLM", QWEN3, model=QUANT_BUGS + "ScaleTransposed")
