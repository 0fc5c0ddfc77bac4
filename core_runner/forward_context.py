"""The one global: attention metadata carried into the model around a forward.

Layers read it with ``get_forward_context()`` so that ``forward(input_ids, positions)``
stays free of metadata arguments.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch

_CONTEXT: "ForwardContext | None" = None


@dataclass(slots=True)
class ForwardContext:
    attn_metadata: Any
    backend: Any


@contextmanager
def set_forward_context(attn_metadata: Any, backend: Any) -> Iterator[None]:
    global _CONTEXT
    prev = _CONTEXT
    _CONTEXT = ForwardContext(attn_metadata, backend)
    try:
        yield
    finally:
        _CONTEXT = prev


def get_forward_context() -> ForwardContext:
    if _CONTEXT is None:
        raise RuntimeError("no forward context: the model was called outside ModelRunner.execute_model")
    return _CONTEXT


def use_triton_kernels(t: torch.Tensor) -> bool:
    """Whether a layer should run its Triton kernel on ``t``: inside a step when the
    step's attention backend is "triton" and ``t`` is on CUDA (or on the CPU under
    TRITON_INTERPRET=1, so the interpreter tests exercise the wiring); outside a step
    when ``t`` is on CUDA."""
    if _CONTEXT is None:
        return t.is_cuda
    if getattr(_CONTEXT.backend, "name", "torch") != "triton":
        return False
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
