"""Prompt logprobs, computed chunk by chunk as the prompt is prefilled.

The logprob of prompt token t comes from the logits at position t - 1, so a scheduled
chunk covering positions [c, c + q) yields targets c + 1 .. min(c + q, P - 1) (P the
prompt length; the first token has none). Only those rows' hidden states go through
the LM head, in sub-chunks of at most ``max_rows`` positions, so peak memory is
``max_rows x vocab`` logits however long the prompt or the step.

Progress lives in the row's sampling state (``prompt_logprobs_next``). A preempted
request is re-added with the engine's count of what it already has, so the re-prefill
skips those positions; the engine also drops any overlap by position, which covers a
chunk that was still in flight when the request was re-added.
"""
from __future__ import annotations

from typing import Callable

import torch

from core_runner.sample.logprobs import LogprobTensors, compute_logprobs
from core_runner.sample.metadata import host_to_device
from core_runner.sample.sampling_state import SamplingState

DEFAULT_MAX_ROWS = 128  # x vocab 151,936 x 4 bytes = 78 MB of logits per sub-chunk


class PromptLogprobs:
    def __init__(self, state: SamplingState, use_triton: bool = False, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        self.state = state
        self.use_triton = use_triton
        self.max_rows = max_rows

    def compute(
        self, batch, hidden: torch.Tensor, compute_logits: Callable[[torch.Tensor], torch.Tensor],
        token_ids: torch.Tensor,
    ) -> tuple[LogprobTensors, list[tuple[str, int, int, int, int]]] | None:
        """Logprobs of this step's new prompt targets, and their spans
        (req_id, first position, count, k, offset into the result)."""
        n = batch.num_reqs
        rows = batch.idx_mapping_cpu[:n].tolist()
        users = self.state.in_batch("prompt_logprobs", rows)
        if not users:
            return None
        qsl = batch.query_start_loc_cpu.tolist()
        computed = batch.num_computed_cpu.tolist()
        hid, trow, tpos, spans = [], [], [], []
        for i in users:
            row, c = rows[i], computed[i]
            h = self.state.host[row]
            first = max(h.prompt_logprobs_next, c + 1)
            last = min(c + qsl[i + 1] - qsl[i], h.num_prompt_tokens - 1)
            if first > last:
                continue
            spans.append((batch.req_ids[i], first, last - first + 1, h.num_prompt_logprobs, len(hid)))
            hid.extend(range(qsl[i] + first - 1 - c, qsl[i] + last - c))
            trow.extend([row] * (last - first + 1))
            tpos.extend(range(first, last + 1))
            h.prompt_logprobs_next = last + 1
            if last + 1 >= h.num_prompt_tokens:
                self.state.users["prompt_logprobs"].discard(row)
        if not spans:
            return None
        where = host_to_device(torch.tensor([hid, trow, tpos], dtype=torch.int64), hidden.device)
        k = max(s[3] for s in spans)
        parts = []
        for s in range(0, len(hid), self.max_rows):
            sub = where[:, s: s + self.max_rows]
            logits = compute_logits(hidden[sub[0]])
            parts.append(compute_logprobs(logits, token_ids[sub[1], sub[2]], k, self.use_triton))
        return LogprobTensors.cat(parts), spans
