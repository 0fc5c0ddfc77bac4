"""Attention metadata, backend and kernel mode carried into the model around a forward.

Per thread: two engines stepping on two threads of one process (two servers in a test, an
engine thread beside an offline engine) each see their own step's context.

Layers read it with ``get_forward_context()`` so that ``forward(input_ids, positions)``
stays free of metadata arguments; ``use_triton_kernels(t)`` tells a layer which of its
implementations (Triton kernel or torch reference) the step's plan chose.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

KERNEL_MODES = ("torch", "triton")

_LOCAL = threading.local()


def _current() -> ForwardContext | None:
    return getattr(_LOCAL, "context", None)


@dataclass(slots=True)
class ForwardContext:
    attn_metadata: Any
    backend: Any
    kernels: str  # the plan's kernel mode for every non-attention layer: "torch" or "triton"


@contextmanager
def set_forward_context(attn_metadata: Any, backend: Any, kernels: str) -> Iterator[None]:
    if kernels not in KERNEL_MODES:
        raise ValueError(f"kernels={kernels!r} is invalid: expected one of {KERNEL_MODES}")
    prev = _current()
    _LOCAL.context = ForwardContext(attn_metadata, backend, kernels)
    try:
        yield
    finally:
        _LOCAL.context = prev


def get_forward_context() -> ForwardContext:
    ctx = _current()
    if ctx is None:
        raise RuntimeError("no forward context: the model was called outside ModelRunner.execute_model")
    return ctx


def use_triton_kernels(t: torch.Tensor) -> bool:
    """Whether a layer should run its Triton kernel on ``t``: inside a step when the
    step's kernel mode is "triton" and ``t`` is on CUDA (or on the CPU under
    TRITON_INTERPRET=1, so the interpreter tests exercise the wiring); outside a step
    when ``t`` is on CUDA. The attention backend does not decide this."""
    ctx = _current()
    if ctx is None:
        return t.is_cuda
    if ctx.kernels != "triton":
        return False
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
