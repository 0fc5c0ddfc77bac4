"""What the scheduler hands the runner each step."""
from __future__ import annotations

from dataclasses import dataclass, field

from core_runner.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequest:
    """A request entering the runner: a fresh one, or a preempted one resuming.

    ``token_ids`` holds every known token (prompt, then anything generated before a
    preemption); ``num_prompt_tokens`` is the length of the original prompt.
    ``eos_token_ids`` are masked (with ``stop_token_ids``) while fewer than min_tokens
    tokens are out. ``num_computed_tokens`` > 0 when the prefix cache supplied blocks.
    ``prompt_logprobs_start`` is the first prompt position whose logprob the engine does
    not have yet (a resumed request skips the others).
    """

    req_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams | None
    seed: int
    # one list per KV cache group (a flat list means group 0 of a one-group model)
    block_ids: list[list[int]] | list[int]
    pooling_params: object | None = None
    eos_token_ids: tuple[int, ...] = ()
    prompt_logprobs_start: int = 1
    # tokens whose KV is already in ``block_ids`` (a prefix-cache hit): the first step
    # computes from here
    num_computed_tokens: int = 0
    # speculative decoding: its settings allow verifying proposals (the runner proposes for it)
    speculative: bool = False
    # structured outputs: the request's GrammarRequest (core_runner/structured_outputs), None without
    structured_output: object | None = None
    # a hit on a model with row state: restore the row's state from this snapshot slot
    # instead of zeroing it (-1: start from zeros)
    state_slot: int = -1


@dataclass(slots=True)
class SchedulerOutput:
    new_reqs: list[NewRequest] = field(default_factory=list)
    # blocks appended to requests already in the runner
    new_block_ids: dict[str, list[list[int]]] = field(default_factory=dict)  # per KV cache group
    # tokens to compute this step, in batch order (decode first)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    # tokens already in the cache before this step
    num_computed_tokens: dict[str, int] = field(default_factory=dict)
    # requests that reach the end of their known tokens this step: their sample is real
    sample_req_ids: set[str] = field(default_factory=set)
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    # speculative decoding: proposals each request verifies this step (scheduled 1 + k tokens)
    spec_token_counts: dict[str, int] = field(default_factory=dict)
    # row-state snapshots: after this step, copy the row state of each request to this slot
    state_snapshots: dict[str, int] = field(default_factory=dict)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens
