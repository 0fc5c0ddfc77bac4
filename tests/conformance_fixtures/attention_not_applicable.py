"""Broken: the plugin template's Llama (a model with attention layers and a paged KV cache)
declaring triton_attention "not applicable". The suite checks such a claim instead of the
feature, so CR-BOUND-05 and CR-EQ-08 must fail it (on any tier), while CR-EQ-01 passes."""
from conformance_fixtures import register
from core_runner import hookimpl

LLAMA_STATE = "model_states.default:DefaultModelState"


@hookimpl
def register_models(registry):
    register(registry, "core_runner_llama_template.model:LlamaForCausalLM", LLAMA_STATE,
             triton_attention="not applicable: claimed attention-free")
