"""What the sampler needs for one step, gathered from the per-row sampling state.

Device tensors are indexed by batch position (decode rows first, as in the step's
InputBatch). A stage whose inputs are None is skipped: that decision was made from the
host mirrors, so building this never reads the device.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host-built tensor on the device without a stream sync (pinned, async)."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


@dataclass(slots=True)
class PenaltyInputs:
    """The rows that use a penalty, with their known tokens read from the token table."""

    batch_idx: torch.Tensor  # [p] int64 batch positions
    token_ids: torch.Tensor  # [p, L] prompt then output tokens (columns >= seq_lens are stale)
    seq_lens: torch.Tensor  # [p] tokens known when this step's token is sampled
    num_prompt: torch.Tensor  # [p] prompt length (outputs start there)
    repetition: torch.Tensor | None  # [p] float32, None when no row of the batch uses it
    frequency: torch.Tensor | None  # [p] float32; set together with presence
    presence: torch.Tensor | None


@dataclass(slots=True)
class SamplingMetadata:
    inv_temp: torch.Tensor  # [n] 1 / T, 0 for greedy rows
    seeds: torch.Tensor  # [n] int64
    positions: torch.Tensor  # [n] position of the token being sampled (the RNG key)
    any_random: bool = False
    # cut settings, None when no sampled row of the batch cuts
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    log_min_p: torch.Tensor | None = None
    top_p_only: bool = False  # every cutting row uses top-p alone (no top-k, no min-p)
    all_top_p: bool = False  # every row is sampled (temperature > 0) with top-p alone
    # logit bias and min_tokens masks: flat indices into [n * V] and values to add
    edits: tuple[torch.Tensor, torch.Tensor] | None = None
    penalties: PenaltyInputs | None = None
    # (batch position, k) of the rows that want logprobs; num_logprobs = max k, -1 none
    logprob_rows: list[tuple[int, int]] = field(default_factory=list)
    logprob_idx: torch.Tensor | None = None  # [r] those batch positions on the device

    @property
    def num_logprobs(self) -> int:
        return max((k for _, k in self.logprob_rows), default=-1)
