"""Broken: Qwen3-MoE makes layer i sparse when i % decoder_sparse_step == 0 instead of (i + 1)."""
from conformance_fixtures.corpus import MOE, MOE_BUGS, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3MoeForCausalLM", MOE, model=MOE_BUGS + "SparseStepOffByOne")
