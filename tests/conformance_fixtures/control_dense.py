"""Control: the Qwen3 plugin and the Llama template as they ship, registered as the dense
corpus bugs are."""
from conformance_fixtures.corpus import LLAMA, QWEN3, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3ForCausalLM", QWEN3)
    register_as_plugin(registry, "LlamaForCausalLM", LLAMA)
