"""Step results copied to the host on their own stream, read when the engine wants them.

The device-to-host copies of the sampled ids and of any extra tensors (logprobs) start
on a side stream right after sampling and signal one event; the engine calls ``get()``
for step N while the GPU is already running step N+1. On the CPU there is nothing to
overlap: ``get`` is immediate. ``extra`` (for example ``StepLogprobs``) names its
tensors in ``extra.tensors`` and turns their host copies into per-request results in
``extra.fill(output, host_tensors)``.
"""
from __future__ import annotations

from typing import Any

import torch

from core_runner.runner.output import ModelRunnerOutput


class AsyncOutput:
    def __init__(
        self, req_ids: list[str], sampled: torch.Tensor | None, pooled: list | None = None,
        copy_stream: torch.cuda.Stream | None = None, extra: Any = None,
    ) -> None:
        self.req_ids = req_ids
        self.pooled = pooled or []
        self._extra = extra
        self._event: torch.cuda.Event | None = None
        tensors = {} if sampled is None else {"sampled": sampled}
        if extra is not None:
            tensors.update(extra.tensors)
        self._host = tensors
        self._result: ModelRunnerOutput | None = None
        on_device = [t for t in tensors.values() if t.is_cuda]
        if on_device:
            if copy_stream is None:
                raise ValueError("a CUDA result needs a copy stream")
            copy_stream.wait_stream(torch.cuda.current_stream(on_device[0].device))
            with torch.cuda.stream(copy_stream):
                self._host = {}
                for name, t in tensors.items():
                    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    host.copy_(t, non_blocking=True)
                    t.record_stream(copy_stream)
                    self._host[name] = host
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
            sampled = self._host.get("sampled")
            ids = sampled.tolist() if sampled is not None else []
            result = ModelRunnerOutput(self.req_ids, ids, self.pooled)
            if self._extra is not None:
                self._extra.fill(result, self._host)
            self._result = result
        return self._result
