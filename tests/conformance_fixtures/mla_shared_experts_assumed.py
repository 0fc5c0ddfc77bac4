"""Broken: DeepSeek-V3 builds one shared expert whatever n_shared_experts says."""
from conformance_fixtures.corpus import MLA_BUGS, V3, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "DeepseekV3ForCausalLM", V3, model=MLA_BUGS + "SharedExpertsAssumedOne")
