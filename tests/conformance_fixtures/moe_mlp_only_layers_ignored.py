"""Broken: Qwen3-MoE never reads mlp_only_layers (every layer is sparse)."""
from conformance_fixtures.corpus import MOE, MOE_BUGS, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3MoeForCausalLM", MOE, model=MOE_BUGS + "MlpOnlyLayersIgnored")
