"""Broken-plugin fixture `xfail_passes`: declares chunked prefill xfail, yet it works. A
strict xfail that passes must fail the run (CR-EQ-02)."""
from conformance_fixtures import DEFAULT_STATE, LLAMA, register
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register(registry, LLAMA, DEFAULT_STATE,
             chunked_prefill="xfail: pretend chunked prefill is known to be broken")
