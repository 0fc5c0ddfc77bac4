"""Broken: mean pooling of a chunked prompt averages its last chunk only."""
from conformance_fixtures.corpus import POOLING_BUGS, QWEN3_EMBED, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "Qwen3Model", QWEN3_EMBED, model_state=POOLING_BUGS + "MeanOfLastChunk")
