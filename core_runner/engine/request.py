"""A request's lifecycle on the engine side."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from core_runner.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)  # identity: the scheduler removes requests from its lists by it
class Request:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams | None
    seed: int
    eos_token_ids: tuple[int, ...] = ()
    pooling_params: object | None = None
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    # tokens scheduled to be sampled whose values have not come back yet (async), and the
    # proposals those steps verify: each may come back as a token, so the host counts them
    # as tokens (and as computed) until the step's result says how many were kept
    num_pending: int = 0
    num_inflight_drafts: int = 0
    # one list per KV cache group (engine/kv_manager.py), NULL_BLOCK where a window let go
    block_ids: list[list[int]] = field(default_factory=lambda: [[]])
    finish_reason: str | None = None
    num_preemptions: int = 0
    # set when the request (re-)enters the runner and cleared once it is sent
    needs_add: bool = True
    pooled: object | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    stop_reason: int | str | None = None
    # incremental detokenizer, for stop strings (None when the request has none)
    detokenizer: Any = None
    # per generated token: {token id: logprob} and the sampled token's rank
    logprobs: list[dict[int, float]] | None = None
    logprob_ranks: list[int] | None = None
    # per prompt position (None first), filled chunk by chunk
    prompt_logprobs: list[dict[int, float] | None] | None = None
    # the prompt's text when it was given as text (RequestOutput.prompt)
    prompt: str | None = None
    # prefix caching: whether the request may take cached blocks (see Scheduler), the
    # hashes of its full blocks, how many of its blocks are registered in the cache, and
    # how many prompt tokens its last admission found cached
    prefix_cacheable: bool = True
    block_hashes: list = field(default_factory=list)
    num_cached_blocks: int = 0
    num_cached_tokens: int = 0
    # the row-state snapshot slot its last admission's hit resumes from (-1: none)
    state_slot: int = -1
    # speculative decoding: whether the request may verify proposals, and its counts of
    # proposed and accepted tokens
    speculative: bool = False
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # whether the proposer found proposals at the last step it ran for the request (n-gram:
    # a match; a draft model always proposes): without any, the next step does not verify
    spec_matched: bool = True
    # structured outputs: the GrammarRequest (compile future + matcher), None without a grammar
    structured_output: Any = None

    def __post_init__(self) -> None:
        sp = self.sampling_params
        if sp is not None and sp.logprobs is not None:
            self.logprobs, self.logprob_ranks = [], []
        if sp is not None and sp.prompt_logprobs is not None:
            self.prompt_logprobs = [None]

    def add_prompt_logprobs(self, first: int, entries: list[dict[int, float]]) -> None:
        """Append the entries for positions first.. that are new (a chunk recomputed
        after a preemption may overlap what is already here)."""
        have = len(self.prompt_logprobs)
        if first > have:
            raise RuntimeError(f"request {self.req_id!r}: prompt logprobs from position {first} arrived "
                               f"but only {have} positions are known")
        self.prompt_logprobs.extend(entries[have - first:])

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Known tokens plus the ones already scheduled to be sampled, proposals in flight
        counted as accepted (an upper bound until their step's result is applied)."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_pending + self.num_inflight_drafts

    @property
    def fully_scheduled(self) -> bool:
        """No further step is needed: the outputs in flight complete the request."""
        sp = self.sampling_params
        if sp is None:
            return self.num_pending > 0 or self.pooled is not None
        return len(self.output_token_ids) + self.num_pending >= sp.max_tokens

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def token_view(self) -> "TokenView":
        """Prompt and output tokens as one sequence without copying them (len and slices)."""
        return TokenView(self.prompt_token_ids, self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED


class TokenView:
    """Two token lists read as one: ``len`` and ``[start:stop]`` slices (step 1, bounds
    within the sequence), which is what block hashing reads. A long request registers a
    block every block_size steps; joining its whole prompt and output for that cost a
    list copy of the full context each time."""

    __slots__ = ("head", "tail")

    def __init__(self, head: list[int], tail: list[int]) -> None:
        self.head, self.tail = head, tail

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def __getitem__(self, s: slice) -> list[int]:
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("TokenView takes [start:stop] slices only")
        n = len(self.head)
        start, stop, _ = s.indices(n + len(self.tail))
        if stop <= n:
            return self.head[start:stop]
        if start >= n:
            return self.tail[start - n:stop - n]
        return self.head[start:] + self.tail[:stop - n]
