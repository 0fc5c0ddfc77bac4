"""Broken at run time: the Qwen3 model's forward raises on a chosen call (a plugin bug or a
device fault inside a step); the engine must finish that step's requests with "error"
and go on (tests/test_step_faults.py)."""
from __future__ import annotations

from core_runner_qwen3.model import Qwen3ForCausalLM

from conformance_fixtures import register_qwen3
from core_runner import hookimpl


class FaultyForward(Qwen3ForCausalLM):
    """``fail_on`` holds the 1-based forward calls that raise ``error`` (a RuntimeError
    unless set, e.g. to KeyboardInterrupt), ``nan_on`` those that return NaN hidden states
    (as an fp16 overflow would); ``calls`` counts every forward."""

    fail_on: set[int] = set()
    nan_on: set[int] = set()
    error: type[BaseException] = RuntimeError
    calls = 0

    def forward(self, *args, **kwargs):
        cls = type(self)
        cls.calls += 1
        if cls.calls in cls.fail_on:
            raise cls.error(f"planted fault in forward call {cls.calls}")
        hidden = super().forward(*args, **kwargs)
        return hidden * float("nan") if cls.calls in cls.nan_on else hidden


@hookimpl
def register_models(registry):
    register_qwen3(registry, "conformance_fixtures.faulty_forward:FaultyForward")
