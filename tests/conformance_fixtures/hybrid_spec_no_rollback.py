"""Broken: the Granite hybrid with a ModelState that skips the rollback. A verification
step computes a decoding request's last token and its proposals together; the scheduler
rolls num_computed_tokens back over the rejected ones, but the Mamba layers' recurrent
state (and conv window) keeps the state after the last proposal, so the next step
continues from a state that has seen tokens the request never kept: CR-SPEC-01 must find
the differing logits, while CR-EQ-01 (no speculation) passes."""
from conformance_fixtures import register_granite
from core_runner import hookimpl
from model_states.mamba_hybrid import MambaHybridModelState


class NoRollbackModelState(MambaHybridModelState):
    def postprocess_verification(self, batch, accepted, counts) -> None:
        return None


@hookimpl
def register_models(registry):
    register_granite(registry, speculative_decoding="supported",
                     model_state="conformance_fixtures.hybrid_spec_no_rollback:NoRollbackModelState")
