"""Broken: Qwen3-MoE loads each expert's gate_proj as its up projection and up_proj as its gate."""
from conformance_fixtures.corpus import MOE, MOE_BUGS, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3MoeForCausalLM", MOE, model=MOE_BUGS + "ExpertGateUpSwapped")
