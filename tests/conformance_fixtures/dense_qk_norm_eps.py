"""Broken: Qwen3's q/k norms use eps 1e-6 whatever rms_norm_eps says."""
from conformance_fixtures.corpus import DENSE_BUGS, QWEN3, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3ForCausalLM", QWEN3, model=DENSE_BUGS + "QkNormEpsHardcoded")
