"""Control: the Qwen3-MoE plugin as it ships, registered as the MoE corpus bugs are."""
from conformance_fixtures.corpus import MOE, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3MoeForCausalLM", MOE)
