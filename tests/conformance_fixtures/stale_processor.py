"""Broken: a logits processor (installed by entry point in the test) that keeps its rows'
state by batch index and forgets that an index changes hands: on ``added`` it records rows
whose ``extra_args`` ask for it (the suite's ``cr_lp`` key) but never clears an index taken
by a request without them, and it ignores ``removed``. A request without arguments that
lands on an index an earlier request held gets that request's edit: fine alone, wrong in a
batch whose rows finish and shift (CR-LP-01 fails)."""
from __future__ import annotations

import torch

from core_runner.sdk import BatchUpdate, LogitsProcessor


class StaleIndexProcessor(LogitsProcessor):
    """Lifts token ``cr_lp % vocab`` of the rows asking for it (a per-request bias)."""

    def __init__(self, config, device: torch.device, is_pin_memory: bool) -> None:
        self.lifted: dict[int, int] = {}  # index -> the token it lifts

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for i, params, _prompt, _output in batch_update.added:
            seed = (params.extra_args or {}).get("cr_lp")
            if seed is not None:
                self.lifted[i] = int(seed)  # the bug: an index taken by another request keeps this

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for i, seed in self.lifted.items():
            if i < logits.shape[0]:
                logits[i, seed % logits.shape[1]] += 20.0
        return logits
