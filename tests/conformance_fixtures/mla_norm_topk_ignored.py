"""Broken: DeepSeek-V3 always renormalises the routed weights, ignoring norm_topk_prob."""
from conformance_fixtures.corpus import MLA_BUGS, V3, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "DeepseekV3ForCausalLM", V3, model=MLA_BUGS + "NormTopkProbIgnored")
