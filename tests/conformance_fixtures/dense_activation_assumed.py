"""Broken: the Llama template runs SiLU whatever hidden_act says (and refuses nothing)."""
from conformance_fixtures.corpus import DENSE_BUGS, LLAMA, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "LlamaForCausalLM", LLAMA, model=DENSE_BUGS + "ActivationAssumedSilu")
