"""Broken: the Llama template's Llama 3 RoPE hard-codes low_freq_factor 1 and high_freq_factor 4."""
from conformance_fixtures.corpus import DENSE_BUGS, LLAMA, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "LlamaForCausalLM", LLAMA, model=DENSE_BUGS + "Llama3BandsHardcoded")
