"""Broken: DeepSeek-V3 applies routed_scaling_factor to the shared experts' output too."""
from conformance_fixtures.corpus import MLA_BUGS, V3, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "DeepseekV3ForCausalLM", V3, model=MLA_BUGS + "RoutedScalingOnShared")
