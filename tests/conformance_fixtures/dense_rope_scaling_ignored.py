"""Broken: Qwen3 builds plain RoPE from rope_theta, ignoring the config's rope scaling."""
from conformance_fixtures.corpus import DENSE_BUGS, QWEN3, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3ForCausalLM", QWEN3, model=DENSE_BUGS + "RopeScalingIgnored")
