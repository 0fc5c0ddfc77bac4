"""Per-row sampling settings, kept in the runner's persistent rows.

Initialised on every add (a reused row never keeps a previous request's settings) and
gathered through idx_mapping each step.
"""
from __future__ import annotations

import torch

from core_runner.engine.scheduler_output import NewRequest
from core_runner.runner.buffers import StagedWriteTensor


class SamplingState:
    def __init__(self, num_rows: int, device: torch.device) -> None:
        self.temperature = StagedWriteTensor((num_rows,), torch.float32, device)
        self.top_k = StagedWriteTensor((num_rows,), torch.int32, device)
        self.top_p = StagedWriteTensor((num_rows,), torch.float32, device)
        self.seed = StagedWriteTensor((num_rows,), torch.int64, device)
        # host mirrors decide which pipeline stages run, without reading the device
        self.temperature_cpu = [0.0] * num_rows
        self.top_k_cpu = [-1] * num_rows
        self.top_p_cpu = [1.0] * num_rows

    def tables(self) -> dict[str, torch.Tensor]:
        return {"temperature": self.temperature.gpu, "top_k": self.top_k.gpu,
                "top_p": self.top_p.gpu, "seed": self.seed.gpu}

    def add(self, row: int, req: NewRequest) -> None:
        sp = req.sampling_params
        temperature, top_k, top_p = (sp.temperature, sp.top_k, sp.top_p) if sp else (0.0, -1, 1.0)
        self.temperature.stage_scalar(row, float(temperature))
        self.top_k.stage_scalar(row, int(top_k))
        self.top_p.stage_scalar(row, float(top_p))
        self.seed.stage_scalar(row, int(req.seed))
        self.temperature_cpu[row], self.top_k_cpu[row], self.top_p_cpu[row] = temperature, top_k, top_p

    def apply_staged_writes(self) -> None:
        for t in (self.temperature, self.top_k, self.top_p, self.seed):
            t.apply_staged_writes()
