"""Broken: DeepSeek-V3 adds e_score_correction_bias to the chosen experts' weights as well as to the choice."""
from conformance_fixtures.corpus import MLA_BUGS, V3, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "DeepseekV3ForCausalLM", V3, model=MLA_BUGS + "CorrectionBiasInWeights")
