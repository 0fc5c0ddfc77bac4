"""Correct: the Qwen3 plugin's model as it ships; passes CR-EQ-12 and CR-EQ-13."""
from conformance_fixtures import register_qwen3
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_qwen3(registry, "core_runner_qwen3.model:Qwen3ForCausalLM")
