"""Logits-processor plugins as one sampler stage (contract: ``core_runner/logits_processor.py``).

Each step the stage turns the batch's order into a ``BatchUpdate`` against the previous step's
(a request at a new position is removed there and added at the new one), keeps each request's
``output_tok_ids`` list growing as tokens arrive (read from the previous step's copy-out before
this step samples, as the grammar stage does: no new device sync), then calls every processor's
``update_state`` and ``apply`` on the stages' float32 copy of the logits.
"""
from __future__ import annotations

from typing import Any

import torch

from core_runner.logits_processor import BatchUpdate
from core_runner.sample.stage import Stage, Step
from core_runner.step_data.scheduler_output import NewRequest


class ProcessorStage(Stage):
    def __init__(self, num_rows: int, device: torch.device) -> None:
        super().__init__(num_rows, device)
        self.processors: list[Any] = []
        self.req: dict[int, tuple[Any, list[int], list[int], int]] = {}  # row -> (params, prompt, output, n_prompt)
        self._order: list[int | None] = []  # row at each batch position last step
        self._pending: tuple[Any, list[tuple[int, str, int]]] | None = None
        self._entries: list[tuple[int, str, int]] = []

    def add_request(self, row: int, req: NewRequest) -> None:
        n = req.num_prompt_tokens
        self.req[row] = (req.sampling_params, list(req.token_ids[:n]), list(req.token_ids[n:]), n)
        self._order = [None if r == row else r for r in self._order]  # a reused row is a new request

    def remove_request(self, row: int) -> None:
        super().remove_request(row)
        self.req.pop(row, None)

    def host_state(self) -> dict[str, Any]:
        return {"rows": sorted(self.req)}

    def _feed_pending(self) -> None:
        if self._pending is None:
            return
        handle, entries = self._pending
        self._pending = None
        sampled = dict(zip(*(lambda r: (r.req_ids, r.sampled_token_ids))(handle.get())))
        for row, req_id, index in entries:
            got = self.req.get(row)
            tok = sampled.get(req_id)
            if got is not None and tok is not None and tok >= 0 and index == len(got[2]):
                got[2].append(int(tok))

    def prepare(self, step: Step, vocab: int) -> BatchUpdate | None:
        self._entries = []
        if not self.processors or step.batch.is_dummy:
            return None
        self._feed_pending()
        rows = step.rows
        old = self._order
        upd = BatchUpdate(batch_size=len(rows))
        for i, r in enumerate(old):
            if r is not None and (i >= len(rows) or rows[i] != r):
                upd.removed.append(i)
        for i, r in enumerate(rows):
            if i >= len(old) or old[i] != r:
                params, prompt, output, _ = self.req[r]
                upd.added.append((i, params, prompt, output))
        self._order = list(rows)
        seq = step.batch.seq_lens_cpu[: step.n].tolist()
        self._entries = [(r, step.batch.req_ids[i], seq[i] - self.req[r][3]) for i, r in enumerate(rows)]
        return upd

    def track(self, handle: Any) -> None:
        self._pending = (handle, self._entries) if self._entries else None
        self._entries = []

    def apply(self, logits: torch.Tensor, upd: BatchUpdate) -> None:
        changed = upd if (upd.added or upd.removed) else None
        for p in self.processors:
            p.update_state(changed)
            out = p.apply(logits)
            if out is not logits:
                logits.copy_(out)
