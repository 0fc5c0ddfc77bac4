"""Broken: the Granite hybrid puts attention at every fourth layer from 1, whatever layer_types says."""
from conformance_fixtures.corpus import GRANITE, HYBRID_BUGS, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "GraniteMoeHybridForCausalLM", GRANITE, model=HYBRID_BUGS + "AttentionEveryFourth")
