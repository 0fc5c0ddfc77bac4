"""Broken: the forward raises past position 2,048, so the long request ends in an error (CR-EQ-13)."""
from conformance_fixtures import QWEN3_BUGS, register_qwen3
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_qwen3(registry, QWEN3_BUGS + "FailsPast2048")
