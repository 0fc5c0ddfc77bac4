from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class RequestOutput:
    """A finished request. ``text`` is empty when the checkpoint has no tokenizer.

    ``stop_reason``: the stop string or stop token id that ended the request (None for
    EOS or a length limit). ``logprobs[i]`` maps the i-th generated token and the top-k
    token ids to their logprobs (raw model distribution); ``logprob_ranks[i]`` is the
    rank of the generated token (1 = most likely). ``prompt_logprobs`` has one such dict
    per prompt token, None for the first. All three are None unless asked for.
    """

    req_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    seed: int | None = None
    num_preemptions: int = 0
    embedding: torch.Tensor | None = None
    first_token_time: float | None = None  # time.perf_counter() when the first token arrived
    finish_time: float | None = None
    stop_reason: int | str | None = None
    logprobs: list[dict[int, float]] | None = None
    logprob_ranks: list[int] | None = None
    cumulative_logprob: float | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None
