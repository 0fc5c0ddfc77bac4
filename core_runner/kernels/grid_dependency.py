"""Programmatic dependent launch (PDL, sm90 and later): a kernel launched with
``launch_pdl=True`` may start while the kernel before it on the stream is still running,
once every program of that one has signalled ``launch_dependents`` (or exited). Its
programs are then resident and waiting when the previous kernel ends, which hides a
launch's latency between the split sampler's short launches (the decide, read 2 and the
rounds, each a few microseconds of work after a long read 1).

``grid_dependency(PDL)`` is the first statement of such a kernel: it waits until the
previous grid has completed and its memory is visible (so nothing before it reads or
writes what that grid touches), then lets the next kernel launch. PDL false compiles to
nothing (the interpreter runs no PTX; a kernel launched without the attribute needs no wait).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def grid_dependency(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


_CAPABLE: dict[int, bool] = {}


def pdl_supported(dev: torch.device) -> bool:
    """PDL can be asked for on this device: CUDA, compute capability 9 or later, not the interpreter."""
    if dev.type != "cuda" or _INTERPRET:
        return False
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index not in _CAPABLE:
        _CAPABLE[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return _CAPABLE[index]
