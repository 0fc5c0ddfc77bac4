"""Broken: o_proj takes its per-channel fp8 scales as one per-tensor value (CR-EQ-18, compressed-tensors)."""
from conformance_fixtures.corpus import QWEN3, register_as_plugin
from core_runner import hookimpl

QUANT_BUGS = "conformance_fixtures.quant_bugs:"


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3ForCausalLM", QWEN3, model=QUANT_BUGS + "ChannelScaleAsTensor")
