"""Which quantization a model is being built for, so that its layers allocate fp8 weights.

``build_model`` constructs a model under ``building_for(quantization)`` (as it does under
``torch.device`` and the default dtype); a layer of ``core_runner.layers`` that can keep
fp8 weights asks ``resident_fp8_block()`` in its constructor and allocates float8_e4m3fn
weights with their scale grid instead of ``dtype`` ones. Plugins pass nothing through
their constructors (vLLM threads a ``quant_config`` through every layer; here a plugin
written without quantization in mind gets it unchanged). A layer whose checkpoint tensor
turns out unquantized (routers, ``ignore``d modules) goes back to ``dtype`` when loaded.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from core_runner.quantization.base import Quantization

_state = threading.local()


@contextlib.contextmanager
def building_for(quantization: Quantization | None) -> Iterator[None]:
    """Layers built inside allocate resident fp8 weights for ``quantization`` (None: dense)."""
    prev = getattr(_state, "quantization", None)
    _state.quantization = quantization
    try:
        yield
    finally:
        _state.quantization = prev


def resident_fp8_block() -> tuple[int, int] | None:
    """The scale grid [b0, b1] a layer built now keeps beside fp8 weights; None: build dense."""
    quant = getattr(_state, "quantization", None)
    return None if quant is None else quant.resident_block
