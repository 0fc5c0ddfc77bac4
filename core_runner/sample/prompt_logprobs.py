"""Prompt logprobs, computed chunk by chunk as the prompt is prefilled.

The logprob of prompt token t comes from the logits at position t - 1, so a scheduled
chunk covering positions [c, c + q) yields targets c + 1 .. min(c + q, P - 1) (P the
prompt length; the first token has none). Only those rows' hidden states go through
the LM head, in sub-chunks of at most ``max_rows`` positions, so peak memory is
``max_rows x vocab`` logits however long the prompt or the step.

Progress lives in the stage's per-row host state (the next position without a logprob). A preempted
request is re-added with the engine's count of what it already has, so the re-prefill
skips those positions; the engine also drops any overlap by position, which covers a
chunk that was still in flight when the request was re-added.
"""
from __future__ import annotations

from typing import Callable

import torch

from core_runner.sample.logprobs import LogprobTensors, compute_logprobs
from core_runner.sample.stage import Stage, Step, host_to_device
from core_runner.step_data.input_batch import InputBatch
from core_runner.step_data.scheduler_output import NewRequest

MAX_ROWS = 128  # x vocab 151,936 x 4 bytes = 78 MB of logits per sub-chunk


class PromptLogprobsStage(Stage):
    """Per row (host only): k, the prompt length and the next position without a logprob."""

    def __init__(self, num_rows: int, device: torch.device, token_ids: torch.Tensor | None,
                 max_rows: int = MAX_ROWS) -> None:
        super().__init__(num_rows, device)
        self.token_ids = token_ids  # the runner's token table
        self.max_rows = max_rows
        self.rows = [(-1, 0, 0)] * num_rows  # (k, num_prompt_tokens, next position)

    def add_request(self, row: int, req: NewRequest) -> None:
        sp = req.sampling_params
        k = -1 if sp is None or sp.prompt_logprobs is None else sp.prompt_logprobs
        self.rows[row] = (k, req.num_prompt_tokens, max(1, req.prompt_logprobs_start))
        self.users.discard(row)
        if k >= 0 and self.rows[row][2] < req.num_prompt_tokens:
            self.users.add(row)

    def remove_request(self, row: int) -> None:
        super().remove_request(row)
        self.rows[row] = (-1, 0, 0)

    def compute(
        self, batch: InputBatch, hidden: torch.Tensor, compute_logits: Callable[[torch.Tensor], torch.Tensor],
        use_triton: bool = False,
    ) -> tuple[LogprobTensors, list[tuple[str, int, int, int, int]]] | None:
        """Logprobs of this step's new prompt targets, and their spans
        (req_id, first position, count, k, offset into the result)."""
        step = Step(batch)
        users = self.in_batch(step)
        if not users:
            return None
        qsl = batch.query_start_loc_cpu.tolist()
        computed = batch.num_computed_cpu.tolist()
        hid, trow, tpos, spans = [], [], [], []
        for i in users:
            row, c = step.rows[i], computed[i]
            k, num_prompt, nxt = self.rows[row]
            first = max(nxt, c + 1)
            last = min(c + qsl[i + 1] - qsl[i], num_prompt - 1)
            if first > last:
                continue
            spans.append((batch.req_ids[i], first, last - first + 1, k, len(hid)))
            hid.extend(range(qsl[i] + first - 1 - c, qsl[i] + last - c))
            trow.extend([row] * (last - first + 1))
            tpos.extend(range(first, last + 1))
            self.rows[row] = (k, num_prompt, last + 1)
            if last + 1 >= num_prompt:
                self.users.discard(row)
        if not spans:
            return None
        where = host_to_device(torch.tensor([hid, trow, tpos], dtype=torch.int64), hidden.device)
        k = max(s[3] for s in spans)
        parts = []
        for s in range(0, len(hid), self.max_rows):
            sub = where[:, s: s + self.max_rows]
            logits = compute_logits(hidden[sub[0]])
            parts.append(compute_logprobs(logits, self.token_ids[sub[1], sub[2]], k, use_triton))
        return LogprobTensors.cat(parts), spans
