"""Broken: the ModelState takes the logprob count (or, without logprobs, the temperature) out
of the request on add, so it is lost when the request is re-added after preemption (CR-STATE-03)."""
from conformance_fixtures import LLAMA, OFFSETS, register
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register(registry, LLAMA, OFFSETS + "LossyParamsState")
