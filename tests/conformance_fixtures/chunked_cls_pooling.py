"""Broken: the Qwen3 embedding model with a cls pooler that forgets the earlier chunks of
a chunked prompt (CR-EQ-11 fails naming pooling cls and the chunks)."""
from conformance_fixtures import register_qwen3_embed
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_qwen3_embed(registry, "conformance_fixtures.chunked_pooling_state:ClsOfLastChunk")
