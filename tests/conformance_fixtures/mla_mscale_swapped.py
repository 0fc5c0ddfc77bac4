"""Broken: DeepSeek-V2's YaRN softmax scale reads rope_scaling's mscale instead of mscale_all_dim."""
from conformance_fixtures.corpus import MLA_BUGS, V2, register_as_plugin
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_as_plugin(registry, "DeepseekV2ForCausalLM", V2, model=MLA_BUGS + "SoftmaxScaleFromMscale")
