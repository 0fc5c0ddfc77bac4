"""Correct: the Qwen3 embedding model with pooling_bugs.LoopPooling, the base of the chunked-prefill pooling bugs."""
from conformance_fixtures.corpus import POOLING_BUGS, QWEN3_EMBED, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3Model", QWEN3_EMBED, model_state=POOLING_BUGS + "LoopPooling")
