"""Control: the Granite hybrid plugin as it ships, registered as the Mamba-hybrid corpus bugs are."""
from conformance_fixtures.corpus import GRANITE, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "GraniteMoeHybridForCausalLM", GRANITE)
