"""Broken: a Qwen3 model that drops sliding windows (full attention on every layer) and does
not refuse them either, so a config with use_sliding_window=True runs full attention without
a word (CR-EQ-12 reports the ignored field)."""
from conformance_fixtures import register_qwen3
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_qwen3(registry, "conformance_fixtures.window_ignored_model:Qwen3IgnoringWindows")
