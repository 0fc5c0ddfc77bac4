"""Broken: the Granite hybrid declaring speculative_decoding supported. A verification
step computes a decoding request's last token and its proposals together; the scheduler
rolls num_computed_tokens back over the rejected ones, but the Mamba layers' recurrent
state (and conv window) has already advanced over them and is not rolled back, so the
next step continues from a state that has seen tokens the request never kept:
CR-SPEC-01 must find the differing logits, while CR-EQ-01 (no speculation) passes."""
from core_runner_granite_hybrid.hooks import CAPABILITIES, TINY

from core_runner import hookimpl


@hookimpl
def register_models(registry):
    registry.add(
        architecture="GraniteMoeHybridForCausalLM",
        model="core_runner_granite_hybrid.model:GraniteMoeHybridForCausalLM",
        model_state="model_states.mamba_hybrid:MambaHybridModelState",
        capabilities={**CAPABILITIES, "speculative_decoding": "supported"},
        reference="transformers:GraniteMoeHybridForCausalLM",
        examples=[{"name": "tiny-dense-nope", "config": {**TINY, "num_local_experts": 0,
                                                         "position_embedding_type": None}}],
    )
