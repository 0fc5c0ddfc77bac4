"""Broken: the Granite hybrid declaring prefix_caching supported. Its ModelState starts a
request's Mamba state from zero even when the prefix cache supplied the first blocks
(the recurrent state at the cached offset is not kept anywhere), so a hit computes the
rest of the prompt from the wrong state: CR-EQ-09 must find the differing output, while
CR-EQ-01 (no hits) passes."""
from core_runner_granite_hybrid.hooks import CAPABILITIES, TINY

from core_runner import hookimpl


@hookimpl
def register_models(registry):
    registry.add(
        architecture="GraniteMoeHybridForCausalLM",
        model="core_runner_granite_hybrid.model:GraniteMoeHybridForCausalLM",
        model_state="model_states.mamba_hybrid:MambaHybridModelState",
        capabilities={**CAPABILITIES, "prefix_caching": "supported"},
        reference="transformers:GraniteMoeHybridForCausalLM",
        examples=[{"name": "tiny-dense-nope", "config": {**TINY, "num_local_experts": 0,
                                                         "position_embedding_type": None}}],
    )
