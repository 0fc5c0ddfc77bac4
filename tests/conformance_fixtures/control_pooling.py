"""Control: the pooling plugin as it ships (BERT and Qwen3 embedding), registered as the
pooling corpus bugs are."""
from conformance_fixtures.corpus import BERT, QWEN3_EMBED, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "BertModel", BERT)
    register_as_plugin(registry, "Qwen3Model", QWEN3_EMBED)
