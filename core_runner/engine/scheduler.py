"""Continuous batching with chunked prefill, paged KV blocks and preemption by recompute.

Each step: running requests first (oldest first), each taking the tokens it still has
to compute up to the remaining token budget; then waiting requests while rows, budget
and blocks last. When a running request needs a block and none is free, the newest
running request is preempted: its blocks are freed and it goes back to the front of the
queue, to re-prefill its prompt plus what it had generated.

The scheduler deals in token counts, never token values, so it can run one step ahead
of the device (async scheduling): a request whose sample is in flight counts that token
as pending, and its next decode reads the token on the device. Values come back in
``update_from_output``, which applies the stop rules.

Prefix caching (``enable_prefix_caching``): a request admitted with nothing computed
(new, or resumed after a preemption) first takes the cached blocks of the longest prefix
of its full blocks (``BlockPool.lookup``), at most up to the block before its last known
token, which is always computed so that a token can be sampled, and never into a block
that step writes. Its block hashes (``block_hash``, chained) are registered as its
blocks fill: a block's KV is written by the step that computes its last token, and steps
run in order, so a block scheduled now may be shared by any later step; output tokens'
blocks are registered once the sampled ids are known (they are pending under async
scheduling). Requests that may not take cached blocks (``Request.prefix_cacheable``)
still register theirs. A failed step's requests free their blocks uncached.

Blocks are kept per KV cache group (``engine/kv_manager.py``): a request holds one list per
group, and a sliding-window group gives back the blocks its window has left.

Row state (``mamba_block_size`` S > 0, docs/hybrid_prefix_caching.md): a prefill chunk that
would cross a multiple of S ends at the first one it crosses (vLLM's "align" mode, at every
boundary), and a
step that ends at a multiple of S (with no proposals in flight) has the runner copy the
row's state into a snapshot slot (``SchedulerOutput.state_snapshots``). The slot becomes
findable, under the hash of the block ending there, once that step's output is back; a hit
then needs a snapshot at its end (``KVCacheManager.take_cached``).
"""
from __future__ import annotations

import logging
import time
from collections import deque

from core_runner.engine.block_hash import extend_hashes
from core_runner.engine.kv_manager import KVCacheManager
from core_runner.engine.request import Request, RequestStatus
from core_runner.runner.output import ModelRunnerOutput
from core_runner.step_data.scheduler_output import NewRequest, SchedulerOutput

logger = logging.getLogger(__name__)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler:
    def __init__(
        self, *, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
        block_size: int, num_blocks: int, chunked_prefill: bool = True, enable_prefix_caching: bool = False,
        num_speculative_tokens: int = 0, num_lookahead_tokens: int = 0,
        kv_cache_windows: list[int | None] | None = None, mamba_block_size: int = 0, mamba_cache_slots: int = 0,
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.chunked_prefill = chunked_prefill
        # one entry per KV cache group: its sliding window (None: full attention); no entry
        # for a model without paged layers (no block is ever needed)
        windows = [None] if kv_cache_windows is None else kv_cache_windows
        self.caching = enable_prefix_caching
        # row-state snapshots every state_interval tokens (0: the model keeps no row state)
        self.state_interval = mamba_block_size if enable_prefix_caching and mamba_cache_slots else 0
        if self.state_interval % block_size:
            raise ValueError(f"mamba_block_size={mamba_block_size} is not a multiple of block_size={block_size}")
        self.kv = KVCacheManager(windows, num_blocks, block_size, margin=num_speculative_tokens,
                                 state_slots=mamba_cache_slots if self.state_interval else 0,
                                 state_blocks=self.state_interval // block_size)
        self.pool = self.kv.pool
        # snapshot slot -> (request, index of the block ending at it), until its step is back
        self._pending_states: dict[int, tuple[Request, int]] = {}
        # tokens looked up in the prefix cache at admission, and of them the tokens found
        # (vLLM's prefix_cache_queries / prefix_cache_hits)
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        # speculative decoding: proposals per decoding request and step (0: off), and the
        # counts behind vLLM's spec_decode metrics (steps that verified, proposed, accepted)
        self.num_spec = num_speculative_tokens
        # a draft model writes its KV up to this many positions past a step's tokens (vLLM's
        # num_lookahead_tokens): a step that samples allocates their blocks too
        self.num_lookahead = num_lookahead_tokens
        self.spec_num_drafts = 0
        self.spec_num_draft_tokens = 0
        self.spec_num_accepted_tokens = 0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: set[str] = set()
        # requests refused when admitted (a grammar that failed to compile): the engine returns them
        self.failed_at_admission: list[Request] = []
        self._forced_preemptions: set[str] = set()
        self.num_preemptions = 0

    # ---- lifecycle ----------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        if req.req_id in self.requests:
            raise ValueError(f"request id {req.req_id!r} is already in use")
        self.requests[req.req_id] = req
        req.block_ids = self.kv.new_table()
        self.waiting.append(req)

    def abort(self, req_id: str) -> Request | None:
        req = self.requests.get(req_id)
        if req is None:
            return None
        self._finish(req, "abort")
        return req

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def _finish(self, req: Request, reason: str, uncache: bool = False) -> None:
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
            self._finished_ids.add(req.req_id)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.finish_time = time.perf_counter()
        self.kv.free(req.block_ids, uncache=uncache)
        req.block_ids = self.kv.new_table()
        del self.requests[req.req_id]

    def fail(self, req_ids: list[str]) -> list[Request]:
        """Finish these requests with "error" (a step fault left their state unknown); their
        blocks are freed and their in-flight samples forgotten. Unknown ids are skipped."""
        failed = []
        gone = set(req_ids)
        for slot, (req, _) in list(self._pending_states.items()):  # their steps' snapshots never ran
            if req.req_id in gone:
                del self._pending_states[slot]
                self.kv.states.free([slot], uncache=True)
        for req_id in req_ids:
            req = self.requests.get(req_id)
            if req is not None:
                req.num_pending = req.num_inflight_drafts = 0
                self._finish(req, "error", uncache=True)
                failed.append(req)
        return failed

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        self.kv.free(req.block_ids)
        req.block_ids = self.kv.new_table()
        req.num_computed_tokens = 0
        req.num_cached_blocks = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted_req_ids.add(req.req_id)
        self.waiting.appendleft(req)
        logger.debug("preempted %s (%d tokens)", req.req_id, req.num_tokens)

    def force_preempt(self, req_id: str) -> None:
        """Preempt a running request now, as a dry KV pool would (its blocks are freed and it
        re-prefills later); the runner hears of it in the next step's preempted_req_ids.
        Only a request whose sampled tokens have all come back can be preempted."""
        req = self.requests.get(req_id)
        if req is None or req.status != RequestStatus.RUNNING or req.num_pending:
            raise ValueError(f"request {req_id!r} is not running with its outputs known: cannot preempt it")
        out = SchedulerOutput()
        self._preempt(req, out)
        self._forced_preemptions |= out.preempted_req_ids

    # the helpers below run once per request per step: keep them lean
    def _grow(self, req: Request, n: int, num_tokens: int) -> list[list[int]] | None:
        end = req.num_computed_tokens + n
        if self.num_lookahead and end >= num_tokens:
            end = min(end + self.num_lookahead, self.max_model_len)
        return self.kv.grow(req.block_ids, req.num_computed_tokens, end)

    def _wants_tokens(self, req: Request, num_tokens: int) -> int:
        if num_tokens >= self.max_model_len or req.fully_scheduled:
            return 0
        return num_tokens - req.num_computed_tokens

    def _commit(self, req: Request, n: int, num_tokens: int, out: SchedulerOutput) -> None:
        rid = req.req_id
        out.num_scheduled_tokens[rid] = n
        out.num_computed_tokens[rid] = req.num_computed_tokens
        req.num_computed_tokens += n
        if req.num_computed_tokens >= num_tokens:  # past it: verifying proposals
            req.num_pending += 1
            out.sample_req_ids.add(rid)
        if self.caching and req.num_computed_tokens >= (req.num_cached_blocks + 1) * self.block_size:
            self._cache_blocks(req)
        if self.state_interval and not req.num_computed_tokens % self.state_interval:
            self._snapshot_state(req, out)

    def _snapshot_state(self, req: Request, out: SchedulerOutput) -> None:
        """Keep the row state the step leaves at a boundary; proposals (this step's or in
        flight) make the true position unknown here, so such steps keep none."""
        rid = req.req_id
        states = self.kv.states
        if out.spec_token_counts.get(rid) or req.num_inflight_drafts or not states.num_free:
            return
        j = req.num_computed_tokens // self.block_size - 1
        if j < len(req.block_hashes) and req.block_hashes[j] in states.cached:
            return  # already kept
        slot = states.allocate(1)[0]
        self._pending_states[slot] = (req, j)
        out.state_snapshots[rid] = slot

    def _publish_states(self, out: SchedulerOutput) -> None:
        """The snapshots written by a step that came back become findable."""
        states = self.kv.states
        for slot in out.state_snapshots.values():
            entry = self._pending_states.pop(slot, None)
            if entry is None:
                continue
            req, j = entry
            tokens = req.all_token_ids
            if len(tokens) >= (j + 1) * self.block_size:
                states.cache(slot, extend_hashes(req.block_hashes, tokens, self.block_size)[j])
            states.free([slot])

    def _align(self, req: Request, n: int) -> int:
        """A prefill chunk that crosses a snapshot boundary ends at the first one it crosses,
        so that the state at every boundary is kept (a shared prefix may end at any)."""
        start = req.num_computed_tokens
        cut = (start // self.state_interval + 1) * self.state_interval
        return cut - start if cut < start + n else n

    def _spec_tokens(self, req: Request, n: int, num_tokens: int, budget: int) -> int:
        """Proposals a decoding request verifies this step: up to num_speculative_tokens, no
        more than its output, max_model_len and the step budget leave room for. With a step
        still in flight (async) the counts are upper bounds: the device knows the true
        position, and the proposals that step's proposer wrote, so nothing waits for it. A
        request whose proposer last found nothing (``spec_matched``) decodes one token."""
        if n != 1 or not req.speculative or not req.output_token_ids or not req.spec_matched:
            return 0
        room_out = req.sampling_params.max_tokens - len(req.output_token_ids) - 1
        return max(0, min(self.num_spec, budget - 1, room_out, self.max_model_len - 1 - num_tokens))

    def _cache_blocks(self, req: Request) -> None:
        """Register the request's blocks that are full of computed KV and known tokens."""
        known = len(req.prompt_token_ids) + len(req.output_token_ids)
        full = min(req.num_computed_tokens, known) // self.block_size
        if full <= req.num_cached_blocks:
            return
        tokens = req.token_view if req.output_token_ids else req.prompt_token_ids
        hashes = extend_hashes(req.block_hashes, tokens, self.block_size)
        self.kv.cache(req.block_ids, hashes, req.num_cached_blocks, full)
        req.num_cached_blocks = full

    def _take_cached(self, req: Request) -> None:
        """A request admitted with nothing computed takes its cached prefix (see the module
        docstring); its num_computed_tokens starts after it."""
        num_tokens = req.num_tokens
        self.prefix_cache_queries += num_tokens
        req.state_slot = -1
        if not req.prefix_cacheable:
            return
        hashes = extend_hashes(req.block_hashes, req.all_token_ids, self.block_size)
        # with a draft model, a draft's KV at a block's last slot read the token after it, which
        # this request may not share: the last hit block is computed again (vLLM's rule for EAGLE)
        table, hit = self.kv.take_cached(hashes, (num_tokens - 1) // self.block_size, bool(self.num_lookahead))
        if hit:
            req.block_ids = table
            req.num_computed_tokens = req.num_cached_blocks = hit
            req.num_computed_tokens *= self.block_size
            if self.state_interval:
                req.state_slot = self.kv.state_slot_of(hashes[hit - 1])
        if not req.num_preemptions:  # RequestOutput reports the first admission's hit
            req.num_cached_tokens = req.num_computed_tokens
        self.prefix_cache_hits += req.num_computed_tokens

    def _untake_cached(self, req: Request) -> None:
        """Give back the cached blocks of a request that could not be admitted after all."""
        self.prefix_cache_queries -= req.num_tokens
        self.prefix_cache_hits -= req.num_computed_tokens
        self.kv.free(req.block_ids)
        req.block_ids, req.num_computed_tokens, req.num_cached_blocks = self.kv.new_table(), 0, 0
        req.state_slot = -1

    def reset_prefix_cache(self) -> int:
        """Forget every cached block (running requests keep theirs) and row-state snapshot;
        returns how many blocks."""
        if self.kv.states is not None:
            self.kv.states.reset()
        return self.pool.reset()

    # ---- one step -----------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_req_ids=self._finished_ids, preempted_req_ids=self._forced_preemptions)
        self._finished_ids, self._forced_preemptions = set(), set()
        budget = self.budget
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_tokens = req.num_tokens
            n = min(self._wants_tokens(req, num_tokens), budget)
            if n <= 0:
                i += 1
                continue
            if self.state_interval and n > 1:
                n = self._align(req, n)
            k = self._spec_tokens(req, n, num_tokens, budget) if self.num_spec else 0
            new_blocks = self._grow(req, n + k, num_tokens)
            while new_blocks is None:
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is req:
                    break
                new_blocks = self._grow(req, n + k, num_tokens)
            if new_blocks is None:
                break
            if any(new_blocks):
                out.new_block_ids[req.req_id] = new_blocks
            if k:
                out.spec_token_counts[req.req_id] = k
                req.num_inflight_drafts += k
            self._commit(req, n + k, num_tokens + k, out)
            budget -= n + k
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.num_pending:
                break  # its last token is still in flight: re-add once it is known
            if req.structured_output is not None and not req.structured_output.ready():
                break  # vLLM's WAITING_FOR_FSM: its grammar is still compiling (off this thread)
            if req.structured_output is not None and req.structured_output.error():
                logger.error("request %s: %s; finishing it with finish_reason='error'", req.req_id,
                             req.structured_output.error())
                self._finish(req, "error")
                self.failed_at_admission.append(req)
                continue
            if self.caching and req.num_computed_tokens == 0:
                self._take_cached(req)
            left = req.num_tokens - req.num_computed_tokens
            n = min(left, budget)
            if self.state_interval and self.chunked_prefill and n > 1:
                n = self._align(req, n)
            if (n < left and not self.chunked_prefill) or self._grow(req, n, req.num_tokens) is None:
                if self.caching and req.num_computed_tokens:
                    self._untake_cached(req)
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.new_reqs.append(NewRequest(
                req_id=req.req_id, token_ids=req.all_token_ids, num_prompt_tokens=req.num_prompt_tokens,
                sampling_params=req.sampling_params, seed=req.seed, block_ids=[list(b) for b in req.block_ids],
                pooling_params=req.pooling_params, eos_token_ids=req.eos_token_ids,
                prompt_logprobs_start=len(req.prompt_logprobs) if req.prompt_logprobs is not None else 1,
                num_computed_tokens=req.num_computed_tokens, speculative=req.speculative and self.num_spec > 0,
                structured_output=req.structured_output,
                state_slot=req.state_slot if req.num_computed_tokens else -1,
            ))
            self._commit(req, n, req.num_tokens, out)
            budget -= n
        return out

    def update_from_output(
        self, out: SchedulerOutput, result: ModelRunnerOutput, finished: list[Request] | None = None,
    ) -> list[Request]:
        """Take the sampled values of one step; returns the requests that finished (appended
        to ``finished`` when given, so that a caller interrupted midway keeps them)."""
        finished = [] if finished is None else finished
        if out.state_snapshots:
            self._publish_states(out)
        sampled = dict(zip(result.req_ids, result.sampled_token_ids))
        pooled = dict(zip(result.req_ids, result.pooled)) if result.pooled else {}
        for req_id, (first, entries) in result.prompt_logprobs.items():
            req = self.requests.get(req_id)
            if req is not None:
                req.add_prompt_logprobs(first, entries)
        for req_id in out.sample_req_ids:
            req = self.requests.get(req_id)
            if req is None:
                continue  # finished or aborted while this step was in flight
            req.num_pending -= 1
            if req.sampling_params is None:
                req.pooled = pooled.get(req_id)
                self._finish(req, "stop")
                finished.append(req)
                continue
            token = sampled[req_id]
            if token < 0:  # the runner flags a token sampled from non-finite logits this way
                logger.error("request %s: the model produced non-finite logits (token %d sampled from "
                             "NaN/inf); finishing it with finish_reason='error'", req_id, -1 - token)
                self._finish(req, "error")
                finished.append(req)
                continue
            tokens = [token]
            k = out.spec_token_counts.get(req_id, 0)
            if k:
                kept = result.spec_token_ids.get(req_id, [])
                tokens = kept + tokens
                req.num_inflight_drafts -= k
                if req.status == RequestStatus.RUNNING:  # a preempted request computes from 0 again
                    req.num_computed_tokens -= k - len(kept)  # rejected proposals' slots are rewritten
                req.num_draft_tokens += k
                req.num_accepted_tokens += len(kept)
                self.spec_num_drafts += 1
                self.spec_num_draft_tokens += k
                self.spec_num_accepted_tokens += len(kept)
            req.spec_matched = result.spec_matched.get(req_id, req.spec_matched)
            reason = None
            for token in tokens:
                req.output_token_ids.append(token)
                if req.logprobs is not None:
                    entry, rank = result.logprobs[req_id]
                    req.logprobs.append(entry)
                    req.logprob_ranks.append(rank)
                if req.first_token_time is None:
                    req.first_token_time = time.perf_counter()
                reason = self._stop_reason(req, token)
                if reason is not None:
                    break
            g = req.structured_output
            if g is not None and reason is None:
                g.sync(req.output_token_ids)
                if g.failed:
                    logger.error("request %s: %s; finishing it with finish_reason='error'", req_id, g.failed)
                    reason = "error"
                elif g.terminated:  # the grammar is complete (with ignore_eos, or no EOS token)
                    reason = "stop"
                elif req_id in result.spec_proposals:  # what its next verification's masks walk
                    g.note_proposals(len(req.output_token_ids), result.spec_proposals[req_id])
            if reason is not None:
                self._finish(req, reason)
                finished.append(req)
            elif self.caching and req.num_computed_tokens >= (req.num_cached_blocks + 1) * self.block_size:
                self._cache_blocks(req)
        return finished

    def _stop_reason(self, req: Request, token: int) -> str | None:
        """Stop rules, none of them before min_tokens: a stop token id (stop_reason =
        the id), EOS unless ignore_eos, a stop string in the detokenised text
        (stop_reason = the string), then the length limits."""
        sp = req.sampling_params
        n_out = len(req.output_token_ids)
        past_min = n_out >= sp.min_tokens
        if past_min:
            if token in sp.stop_token_ids:
                req.stop_reason = token
                return "stop"
            if not sp.ignore_eos and token in req.eos_token_ids:
                return "stop"
        if req.detokenizer is not None:
            hit = req.detokenizer.append(token, check_stop=past_min)
            if hit is not None:
                req.stop_reason = hit
                return "stop"
        if n_out >= sp.max_tokens or len(req.prompt_token_ids) + n_out >= self.max_model_len:
            return "length"
        return None
