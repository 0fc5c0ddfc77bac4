"""Continuous batching with chunked prefill, paged KV blocks and preemption by recompute.

Each step: running requests first (oldest first), each taking the tokens it still has
to compute up to the remaining token budget; then waiting requests while rows, budget
and blocks last. When a running request needs a block and none is free, the newest
running request is preempted: its blocks are freed and it goes back to the front of the
queue, to re-prefill its prompt plus what it had generated. The scheduler deals only in
token counts, never token values, so it can run ahead of the device.
"""
from __future__ import annotations

import logging
from collections import deque

from core_runner.engine.block_pool import BlockPool
from core_runner.engine.request import Request, RequestStatus
from core_runner.engine.scheduler_output import NewRequest, SchedulerOutput
from core_runner.runner.output import ModelRunnerOutput

logger = logging.getLogger(__name__)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler:
    def __init__(
        self, *, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
        block_size: int, num_blocks: int, chunked_prefill: bool = True,
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.chunked_prefill = chunked_prefill
        self.pool = BlockPool(num_blocks)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: set[str] = set()
        self.num_preemptions = 0

    # ---- lifecycle ----------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        if req.req_id in self.requests:
            raise ValueError(f"request id {req.req_id!r} is already in use")
        self.requests[req.req_id] = req
        self.waiting.append(req)

    def abort(self, req_id: str) -> Request | None:
        req = self.requests.get(req_id)
        if req is None or req.is_finished:
            return None
        if req in self.waiting:
            self.waiting.remove(req)
        self._finish(req, "abort")
        return req

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _finish(self, req: Request, reason: str) -> None:
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
            self._finished_ids.add(req.req_id)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        self.pool.free(req.block_ids)
        req.block_ids = []
        del self.requests[req.req_id]

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        self.pool.free(req.block_ids)
        req.block_ids = []
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.needs_add = True
        req.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted_req_ids.add(req.req_id)
        self.waiting.appendleft(req)
        logger.debug("preempted %s (%d tokens)", req.req_id, req.num_tokens)

    def _grow(self, req: Request, n: int) -> list[int] | None:
        need = cdiv(req.num_computed_tokens + n, self.block_size) - len(req.block_ids)
        if need > self.pool.num_free:
            return None
        new = self.pool.allocate(max(need, 0))
        req.block_ids.extend(new)
        return new

    # ---- one step -----------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_req_ids=self._finished_ids)
        self._finished_ids = set()
        budget = self.budget
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n <= 0:
                i += 1
                continue
            new_blocks = self._grow(req, n)
            while new_blocks is None:
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is req:
                    break
                new_blocks = self._grow(req, n)
            if new_blocks is None:
                break
            if new_blocks:
                out.new_block_ids[req.req_id] = new_blocks
            out.num_scheduled_tokens[req.req_id] = n
            out.num_computed_tokens[req.req_id] = req.num_computed_tokens
            budget -= n
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            n = min(req.num_tokens, budget)
            if n < req.num_tokens and not self.chunked_prefill:
                break
            if self._grow(req, n) is None:
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.new_reqs.append(NewRequest(
                req_id=req.req_id, token_ids=req.all_token_ids, num_prompt_tokens=req.num_prompt_tokens,
                sampling_params=req.sampling_params, seed=req.seed, block_ids=list(req.block_ids),
                pooling_params=req.pooling_params,
            ))
            req.needs_add = False
            out.num_scheduled_tokens[req.req_id] = n
            out.num_computed_tokens[req.req_id] = 0
            budget -= n
        return out

    def update_from_output(self, out: SchedulerOutput, result: ModelRunnerOutput) -> list[Request]:
        """Advance counts, append sampled tokens, apply stop rules; returns finished requests."""
        finished = []
        sampled = dict(zip(result.req_ids, result.sampled_token_ids))
        pooled = dict(zip(result.req_ids, result.pooled)) if result.pooled else {}
        for req_id, n in out.num_scheduled_tokens.items():
            req = self.requests.get(req_id)
            if req is None or req.status != RequestStatus.RUNNING:
                continue
            req.num_computed_tokens += n
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk: nothing sampled yet
            if req.sampling_params is None:
                req.pooled = pooled.get(req_id)
                self._finish(req, "stop")
                finished.append(req)
                continue
            token = sampled[req_id]
            req.output_token_ids.append(token)
            reason = self._stop_reason(req, token)
            if reason is not None:
                self._finish(req, reason)
                finished.append(req)
        return finished

    def _stop_reason(self, req: Request, token: int) -> str | None:
        sp = req.sampling_params
        n_out = len(req.output_token_ids)
        if n_out >= sp.min_tokens:
            if token in sp.stop_token_ids:
                return "stop"
            if not sp.ignore_eos and token in req.eos_token_ids:
                return "stop"
        if n_out >= sp.max_tokens or req.num_tokens >= self.max_model_len:
            return "length"
        return None
