"""Broken: Qwen3 builds q/k/v/o without bias whatever attention_bias says."""
from conformance_fixtures.corpus import DENSE_BUGS, QWEN3, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3ForCausalLM", QWEN3, model=DENSE_BUGS + "AttentionBiasIgnored")
