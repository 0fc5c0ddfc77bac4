"""Broken: the Granite hybrid's ModelState starts a request's Mamba state from zero even
when the prefix cache supplied the first blocks and a state snapshot (it ignores the
snapshot slot), so a hit computes the rest of the prompt from the wrong state: CR-EQ-09
must find the differing output, while CR-EQ-01 (no hits) passes."""
from conformance_fixtures import register_granite
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_granite(registry, model_state="conformance_fixtures.row_state_bugs:IgnoresSnapshot")
