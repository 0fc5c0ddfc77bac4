"""Broken: the Qwen3 plugin's model registered without its accepted_config, so a config with
use_sliding_window=True runs full attention without a word (CR-EQ-12 reports the ignored field)."""
from conformance_fixtures import register_qwen3
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_qwen3(registry, "core_runner_qwen3.model:Qwen3ForCausalLM", declare_limits=False)
