from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class RequestOutput:
    """A finished request. ``text`` is empty when the checkpoint has no tokenizer."""

    req_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    seed: int | None = None
    num_preemptions: int = 0
    embedding: torch.Tensor | None = None
    first_token_time: float | None = None  # time.perf_counter() when the first token arrived
    finish_time: float | None = None
