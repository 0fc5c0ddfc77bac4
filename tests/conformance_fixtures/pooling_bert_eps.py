"""Broken: BERT's LayerNorms use eps 1e-12 whatever layer_norm_eps says."""
from conformance_fixtures.corpus import BERT, POOLING_BUGS, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "BertModel", BERT, model=POOLING_BUGS + "LayerNormEpsHardcoded")
