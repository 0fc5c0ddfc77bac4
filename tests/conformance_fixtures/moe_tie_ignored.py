"""Broken: Qwen3-MoE builds its own LM head whatever tie_word_embeddings says."""
from conformance_fixtures.corpus import MOE, MOE_BUGS, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3MoeForCausalLM", MOE, model=MOE_BUGS + "TieIgnored")
