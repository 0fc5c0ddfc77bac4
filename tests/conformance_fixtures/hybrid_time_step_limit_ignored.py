"""Broken: the Granite hybrid never clamps dt to time_step_limit."""
from conformance_fixtures.corpus import GRANITE, HYBRID_BUGS, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "GraniteMoeHybridForCausalLM", GRANITE, model=HYBRID_BUGS + "TimeStepLimitIgnored")
