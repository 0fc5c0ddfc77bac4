"""Broken: BERT uses the exact GELU whatever hidden_act says."""
from conformance_fixtures.corpus import BERT, POOLING_BUGS, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "BertModel", BERT, model=POOLING_BUGS + "ExactGeluAlways")
