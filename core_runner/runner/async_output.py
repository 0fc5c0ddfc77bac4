"""Step results copied to the host on their own stream, read when the engine wants them.

The device-to-host copy of the sampled ids starts on a side stream right after
sampling and signals an event; the engine calls ``get()`` for step N while the GPU is
already running step N+1. On the CPU there is nothing to overlap: ``get`` is immediate.
"""
from __future__ import annotations

import torch

from core_runner.runner.output import ModelRunnerOutput


class AsyncOutput:
    def __init__(
        self, req_ids: list[str], sampled: torch.Tensor | None, pooled: list | None = None,
        copy_stream: torch.cuda.Stream | None = None,
    ) -> None:
        self.req_ids = req_ids
        self.pooled = pooled or []
        self._event: torch.cuda.Event | None = None
        self._host = sampled
        self._result: ModelRunnerOutput | None = None
        if sampled is not None and sampled.is_cuda:
            if copy_stream is None:
                raise ValueError("a CUDA result needs a copy stream")
            copy_stream.wait_stream(torch.cuda.current_stream(sampled.device))
            with torch.cuda.stream(copy_stream):
                self._host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)
                self._host.copy_(sampled, non_blocking=True)
                sampled.record_stream(copy_stream)
                self._event = torch.cuda.Event()
                self._event.record(copy_stream)

    @classmethod
    def done(cls, output: ModelRunnerOutput) -> "AsyncOutput":
        obj = cls(output.req_ids, None, output.pooled)
        obj._result = output
        return obj

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def get(self) -> ModelRunnerOutput:
        if self._result is None:
            if self._event is not None:
                self._event.synchronize()
            ids = self._host.tolist() if self._host is not None else []
            self._result = ModelRunnerOutput(self.req_ids, ids, self.pooled)
        return self._result
