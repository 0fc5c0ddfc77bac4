"""Broken: the Granite hybrid's Mamba output norm spans all B/C groups (mamba_n_groups assumed 1 there)."""
from conformance_fixtures.corpus import GRANITE, HYBRID_BUGS, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "GraniteMoeHybridForCausalLM", GRANITE, model=HYBRID_BUGS + "GatedNormOverAllGroups")
