"""What one step returns to the engine."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class ModelRunnerOutput:
    """``sampled_token_ids[i]`` belongs to ``req_ids[i]``; it is meaningful only for
    requests that consumed all their known tokens this step (the scheduler knows which).

    ``logprobs[req_id]`` = ({token id: logprob}, rank of the sampled token) for requests
    that asked for logprobs; ``prompt_logprobs[req_id]`` = (first prompt position,
    [{token id: logprob}, ...]) for the prompt positions this step computed.
    """

    req_ids: list[str]
    sampled_token_ids: list[int]
    pooled: list[torch.Tensor | None] = field(default_factory=list)
    logprobs: dict[str, tuple[dict[int, float], int]] = field(default_factory=dict)
    prompt_logprobs: dict[str, tuple[int, list[dict[int, float]]]] = field(default_factory=dict)
    # speculative decoding: the proposals each verifying request kept, before its sampled token
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # whether the proposer found proposals for the request's next step (n-gram: a match)
    spec_matched: dict[str, bool] = field(default_factory=dict)
    # the proposals a structured-output request's next step verifies (its grammar masks need them)
    spec_proposals: dict[str, list[int]] = field(default_factory=dict)


EMPTY_OUTPUT = ModelRunnerOutput([], [])
