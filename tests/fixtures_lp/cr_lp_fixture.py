"""A logits-processor plugin outside core_runner (vLLM's DummyLogitsProcessor idea): a request
whose ``extra_args`` has ``target_token`` can only sample that token; other rows are untouched.
Registered by entry point in tests (group ``core_runner.logits_processors``)."""
from __future__ import annotations

import torch

from core_runner.sdk import BatchUpdate, LogitsProcessor, MoveDirectionality


class TargetTokenProcessor(LogitsProcessor):
    def __init__(self, config, device: torch.device, is_pin_memory: bool) -> None:
        self.targets: dict[int, int] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for i in batch_update.removed:
            self.targets.pop(i, None)
        for i, params, _prompt, _out in batch_update.added:
            t = (params.extra_args or {}).get("target_token")
            if t is None:
                self.targets.pop(i, None)
            else:
                self.targets[i] = int(t)
        for a, b, how in batch_update.moved:
            ta, tb = self.targets.pop(a, None), self.targets.pop(b, None)
            if ta is not None:
                self.targets[b] = ta
            if tb is not None and how == MoveDirectionality.SWAP:
                self.targets[a] = tb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.targets:
            return logits
        rows = torch.tensor(list(self.targets), device=logits.device)
        cols = torch.tensor(list(self.targets.values()), device=logits.device)
        keep = logits[rows, cols]
        logits[rows] = float("-inf")
        logits[rows, cols] = keep
        return logits
