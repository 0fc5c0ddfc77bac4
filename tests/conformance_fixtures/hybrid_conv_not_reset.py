"""Broken: the Granite hybrid's ModelState resets a reused row's SSM state but not its conv
window, so a request placed in a finished request's row starts its convolution from the
previous request's last inputs: CR-STATE-01 must find it, while CR-EQ-01 (fresh rows) passes."""
from conformance_fixtures import register_granite
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_granite(registry, model_state="conformance_fixtures.row_state_bugs:ConvNotReset")
