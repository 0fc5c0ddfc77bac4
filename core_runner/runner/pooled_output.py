"""A pooling step's outputs, copied to the host in one transfer per dtype.

``ModelState.pool`` returns one device tensor (or None) per request. Handing those on as
they are would make each request's first read (``float(x)``, ``.tolist()``, the serving
split's ``tensor_to_wire``) a separate device-to-host copy and sync, one per finished
request, and would keep the step's device buffers alive for as long as an output is held.
Instead the step's tensors are flattened into one buffer per dtype, copied with the step's
other results on the runner's copy stream (``AsyncOutput``), and split back into one CPU
tensor per request, of the shape and dtype the state returned: what vLLM's pooling
outputs are (CPU tensors).
"""
from __future__ import annotations

import torch

from core_runner.runner.output import ModelRunnerOutput


class PooledCopy:
    """``AsyncOutput`` extra: ``tensors`` to copy, ``fill`` to rebuild ``output.pooled``."""

    def __init__(self, pooled: list[torch.Tensor | None]) -> None:
        self.size = len(pooled)
        # (request index, dtype key, offset, shape) of each tensor, in batch order
        self.parts: list[tuple[int, str, int, torch.Size]] = []
        groups: dict[str, list[torch.Tensor]] = {}
        offsets: dict[str, int] = {}
        for i, t in enumerate(pooled):
            if t is None:
                continue
            key = f"pooled:{t.dtype}"
            flat = t.reshape(-1)
            self.parts.append((i, key, offsets.get(key, 0), t.shape))
            groups.setdefault(key, []).append(flat)
            offsets[key] = offsets.get(key, 0) + flat.numel()
        # cat copies even one tensor: the outputs must not alias a buffer the state writes again
        self.tensors = {key: torch.cat(flats) for key, flats in groups.items()}

    def fill(self, output: ModelRunnerOutput, host: dict[str, torch.Tensor]) -> None:
        pooled: list[torch.Tensor | None] = [None] * self.size
        for i, key, offset, shape in self.parts:
            pooled[i] = host[key][offset: offset + shape.numel()].view(shape)
        output.pooled = pooled
