"""Control: the DeepSeek plugin as it ships (V2 and V3), registered as the MLA corpus bugs are."""
from conformance_fixtures.corpus import V2, V3, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "DeepseekV2ForCausalLM", V2)
    register_as_plugin(registry, "DeepseekV3ForCausalLM", V3)
