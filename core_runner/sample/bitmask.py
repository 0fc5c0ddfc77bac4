"""Structured outputs in the sampler: a packed token bitmask, applied before every other stage.

Each grammar row's allowed next tokens arrive as a row of int32 words (bit ``t % 32`` of
word ``t // 32`` set = token t allowed, xgrammar's layout); disallowed logits become -inf.
The host fills the mask of step N+1 once step N's tokens are known: ``GrammarStage.prepare``
runs after the forward of step N+1 is launched, reads step N's copy-out (the wait overlaps
that forward on the device), advances the matchers, fills a pinned mask and copies it
non-blocking. Design and the async pipeline: docs/structured_outputs.md.
"""
from __future__ import annotations

from typing import Any

import torch

from core_runner.sample.stage import Stage, Step, host_to_device
from core_runner.step_data.scheduler_output import NewRequest


def apply_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """In place: logits[rows[j], t] = -inf where bit t of bitmask[j] is 0 (torch reference)."""
    v = logits.shape[-1]
    cols = torch.arange(v, device=logits.device)
    words = bitmask[:, cols // 32]
    allowed = ((words >> (cols % 32).to(words.dtype)) & 1).bool()
    sub = logits[rows]
    logits[rows] = sub.masked_fill(~allowed, float("-inf"))


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, use_triton: bool) -> None:
    if use_triton:
        from core_runner.sample.bitmask_triton import apply_bitmask_triton

        apply_bitmask_triton(logits, bitmask, rows)
    else:
        apply_bitmask_ref(logits, bitmask, rows)


class GrammarStage(Stage):
    """Per row: the request's ``GrammarRequest`` (host only) and its prompt length.

    ``track(handle, batch)`` remembers the last step's copy-out and, per grammar row of that
    step, the output index its sampled token has; ``prepare`` feeds those tokens first."""

    def __init__(self, num_rows: int, device: torch.device, use_triton: bool = False) -> None:
        super().__init__(num_rows, device)
        self.grammar: list[Any] = [None] * num_rows
        self.num_prompt = [0] * num_rows
        self.use_triton = use_triton
        self._pending: tuple[Any, list[tuple[Any, int, int]]] | None = None
        self._words = 0
        self._host: torch.Tensor | None = None

    def add_request(self, row: int, req: NewRequest) -> None:
        g = getattr(req, "structured_output", None)
        self.grammar[row] = g
        self.num_prompt[row] = req.num_prompt_tokens
        self.users.discard(row)
        if g is not None:
            g.reset(req.token_ids[req.num_prompt_tokens:])  # a resumed request replays its output
            self.users.add(row)

    def remove_request(self, row: int) -> None:
        super().remove_request(row)
        self.grammar[row] = None
        self.num_prompt[row] = 0

    def host_state(self) -> dict[str, Any]:
        """Per-row mirrors only (the pending copy-out and scratch mask are per step, not per row)."""
        return {"users": sorted(self.users), "num_prompt": list(self.num_prompt),
                "grammar": [g is not None for g in self.grammar]}

    def _out_index(self, step: Step, i: int) -> int:
        return int(step.batch.seq_lens_cpu[i]) - self.num_prompt[step.rows[i]]

    def _feed_pending(self) -> None:
        if self._pending is None:
            return
        handle, entries = self._pending
        self._pending = None
        result = handle.get()  # waits for the previous step's copy-out, not for this step
        sampled = dict(zip(result.req_ids, result.sampled_token_ids))
        for g, index, req_id in entries:
            tok = sampled.get(req_id)
            if tok is not None and tok >= 0:
                g.feed(index, tok)

    def prepare(self, step: Step, vocab: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        users = self.in_batch(step)
        self._step_entries = []
        if not users:
            return None
        self._feed_pending()
        words = -(-vocab // 32)
        if self._host is None or self._host.shape[1] != words or self._host.shape[0] < len(users):
            self._host = torch.empty((max(len(users), 8), words), dtype=torch.int32,
                                     pin_memory=self.device.type == "cuda")
        positions = []
        for i in users:
            g = self.grammar[step.rows[i]]
            if g is None:
                continue
            index = self._out_index(step, i)
            self._step_entries.append((g, index, step.batch.req_ids[i]))
            if index != g.num_fed:  # a prefill chunk before the end of the known tokens: no real sample
                continue
            if g.fill(self._host, len(positions)):
                positions.append(i)
        if not positions:
            return None
        mask = self._host[: len(positions)]
        rows = torch.tensor(positions, dtype=torch.int64)
        if self.device.type == "cuda":
            return mask.to(self.device, non_blocking=True), host_to_device(rows, self.device)
        return mask.clone(), rows

    def track(self, handle: Any) -> None:
        """The copy-out of the step just launched: its grammar rows' tokens are fed next step."""
        entries = getattr(self, "_step_entries", None)
        self._pending = (handle, entries) if entries else None
        self._step_entries = []

    def apply(self, logits: torch.Tensor, x: tuple[torch.Tensor, torch.Tensor]) -> None:
        apply_bitmask(logits, x[0], x[1], self.use_triton)
