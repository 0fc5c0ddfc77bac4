"""Broken: the Granite hybrid's causal conv has width 4 whatever mamba_d_conv says."""
from conformance_fixtures.corpus import GRANITE, HYBRID_BUGS, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "GraniteMoeHybridForCausalLM", GRANITE, model=HYBRID_BUGS + "ConvWidthHardcoded")
