"""Broken: the Granite hybrid reads the conv bias flag from mamba_proj_bias."""
from conformance_fixtures.corpus import GRANITE, HYBRID_BUGS, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "GraniteMoeHybridForCausalLM", GRANITE, model=HYBRID_BUGS + "ConvBiasFromProjBias")
