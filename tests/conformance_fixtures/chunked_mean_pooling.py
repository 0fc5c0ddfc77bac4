"""Broken: the Qwen3 embedding model with a mean pooler that forgets the earlier chunks of
a chunked prompt (CR-EQ-11 fails naming pooling mean and the chunks)."""
from conformance_fixtures import register_qwen3_embed
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_qwen3_embed(registry, "conformance_fixtures.chunked_pooling_state:MeanOfLastChunk")
