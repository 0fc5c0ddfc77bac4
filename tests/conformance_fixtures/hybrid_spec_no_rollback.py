"""Broken: the Granite hybrid declaring speculative_decoding supported. A verification
step computes a decoding request's last token and its proposals together; the scheduler
rolls num_computed_tokens back over the rejected ones, but the Mamba layers' recurrent
state (and conv window) has already advanced over them and is not rolled back, so the
next step continues from a state that has seen tokens the request never kept:
CR-SPEC-01 must find the differing logits, while CR-EQ-01 (no speculation) passes."""
from conformance_fixtures import register_granite
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_granite(registry, speculative_decoding="supported")
