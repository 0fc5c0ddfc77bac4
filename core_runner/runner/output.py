"""What one step returns to the engine."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class ModelRunnerOutput:
    """``sampled_token_ids[i]`` belongs to ``req_ids[i]``; it is meaningful only for
    requests that consumed all their known tokens this step (the scheduler knows which).
    """

    req_ids: list[str]
    sampled_token_ids: list[int]
    pooled: list[torch.Tensor | None] = field(default_factory=list)


EMPTY_OUTPUT = ModelRunnerOutput([], [])
