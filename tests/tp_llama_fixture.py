"""A tensor-parallel Llama for the loader's engine-level test: the template plugin's
model (its projections are the column / row-parallel layers, the embedding and LM head
split the vocabulary), registered as a plugin that declares ``tensor_parallel`` and
``quantization:fp8``. Workers import it by name ("tp_llama_fixture:TPLlamaForCausalLM"):
the test's sys.path travels to them."""
from __future__ import annotations

from core_runner_llama_template import model as template

from core_runner import hookimpl


class TPLlamaForCausalLM(template.LlamaForCausalLM):
    """The template's model under its own name, so this registration is told apart."""


@hookimpl
def register_models(registry):
    registry.add(
        architecture="LlamaForCausalLM", model="tp_llama_fixture:TPLlamaForCausalLM",
        model_state="model_states.default:DefaultModelState",
        capabilities={"tensor_parallel": "supported", "quantization:fp8": "supported",
                      "chunked_prefill": "supported"},
    )
