"""Temperature and Gumbel-Max: the draw every sampled row ends with (torch reference).

argmax(logits / T + Gumbel noise) is an exact draw from softmax(logits / T); the softmax
is never formed. The noise comes from ``rng``, keyed by (request seed, token position), so
a seeded request draws the same tokens whatever batch or row it runs in. Temperature 0
(below GREEDY_EPS, where 1 / T would overflow) is the plain argmax. The Triton twin is
``gumbel_triton.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from core_runner.sample import rng
from core_runner.sample.stage import Stage, Step
from core_runner.step_data.scheduler_output import NewRequest

GREEDY_EPS = 1e-5


def inverse_temperature(temperature: torch.Tensor) -> torch.Tensor:
    """1 / T, and 0 for greedy rows (T == 0): the form every kernel takes."""
    t = temperature.float()
    return torch.where(t > 0, 1.0 / t, torch.zeros_like(t))


def gumbel_sample_ref(
    logits: torch.Tensor, inv_temp: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
    threshold: torch.Tensor | None = None,
) -> torch.Tensor:
    """argmax of x + noise over x = logits * inv_temp (x >= threshold); argmax of the logits
    where inv_temp is 0."""
    logits = logits.float()
    x = logits * inv_temp[:, None].float()
    if threshold is not None:
        x = x.masked_fill(x < threshold[:, None], float("-inf"))
    noisy = x + rng.gumbel(seeds, positions, logits.shape[-1])
    return torch.where(inv_temp > 0, noisy.argmax(dim=-1), logits.argmax(dim=-1))


@dataclass(slots=True)
class Draw:
    """The RNG and temperature inputs of one step, in batch order."""

    inv_temp: torch.Tensor  # [n] float32, 0 for greedy rows
    seeds: torch.Tensor  # [n] int64
    positions: torch.Tensor  # [n] position of the token being sampled (the RNG key)


class TemperatureStage(Stage):
    """Temperature and seed of each row; ``users`` are the rows that sample (T > 0)."""

    def __init__(self, num_rows: int, device: torch.device) -> None:
        super().__init__(num_rows, device, {"temperature": torch.float32, "seed": torch.int64})
        self.temperature_cpu = [0.0] * num_rows

    def add_request(self, row: int, req: NewRequest) -> None:
        sp = req.sampling_params
        t = float(sp.temperature) if sp is not None and sp.temperature >= GREEDY_EPS else 0.0
        self.write(row, temperature=t, seed=req.seed)
        self.temperature_cpu[row] = t
        self.users.discard(row)
        if t > 0:
            self.users.add(row)

    def remove_request(self, row: int) -> None:
        super().remove_request(row)
        self.temperature_cpu[row] = 0.0

    def prepare(self, step: Step) -> Draw | None:
        """None when every row of the batch is greedy."""
        if not self.in_batch(step):
            return None
        inv = inverse_temperature(self.gather("temperature", step))
        return Draw(inv, self.gather("seed", step), step.batch.seq_lens[: step.n])
