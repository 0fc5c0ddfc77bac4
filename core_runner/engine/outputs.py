"""What the engine hands back, in vLLM's shape.

A generation request gives a ``RequestOutput`` holding one ``CompletionOutput`` per sample
(``SamplingParams.n``); an embedding request gives an ``EmbeddingRequestOutput`` whose
``outputs.embedding`` is a list of floats. Logprobs are ``{token id: Logprob}`` dicts, one
per position, as in vLLM, so a script written against vLLM reads them unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(slots=True)
class Logprob:
    """One token's log probability under the raw model distribution (before penalties,
    bias and temperature); ``rank`` 1 is the most likely token; ``decoded_token`` is the
    token's text (None without a tokenizer)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass(slots=True)
class CompletionOutput:
    """One sample of a request. ``finish_reason`` is "stop", "length", "abort" or "error"
    (None while unfinished); ``stop_reason`` is the stop string or stop token id that ended
    it (None for EOS or a length limit). ``logprobs`` is None unless
    ``SamplingParams.logprobs`` was set."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    """A generation request's result: ``outputs[i]`` is sample i (``SamplingParams.n``).

    ``prompt`` is the prompt's text when it was given as text (None for token ids).
    ``prompt_logprobs`` has one dict per prompt token, None for the first.

    Core-runner extras beyond vLLM's fields: ``seed`` (the seed sample 0 used, drawn at add
    time when not given), ``num_preemptions``, ``first_token_time`` / ``finish_time``
    (``time.perf_counter()``), and read-only properties ``req_id``, ``token_ids``,
    ``text``, ``finish_reason``, ``stop_reason`` and ``cumulative_logprob`` that read
    ``outputs[0]``, for code written before the vLLM shape.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    seed: int | None = None
    num_preemptions: int = 0
    # speculative decoding: tokens proposed for the request and of them accepted
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    first_token_time: float | None = None
    finish_time: float | None = None

    @property
    def req_id(self) -> str:
        return self.request_id

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def stop_reason(self) -> int | str | None:
        return self.outputs[0].stop_reason

    @property
    def cumulative_logprob(self) -> float | None:
        return self.outputs[0].cumulative_logprob


@dataclass(slots=True)
class EmbeddingOutput:
    """One prompt's vector. ``embedding`` is vLLM's list of floats; ``data`` (vLLM's
    PoolingOutput name) is the same vector as a tensor: float32 on the CPU from
    ``LLM.embed``, as the runner left it from ``LLMEngine.step``."""

    data: torch.Tensor

    @property
    def embedding(self) -> list[float]:
        return self.data.tolist()

    @property
    def hidden_size(self) -> int:
        return int(self.data.shape[-1])


@dataclass(slots=True)
class ClassificationOutput:
    """One prompt's class probabilities (vLLM's ClassificationOutput): ``probs`` a list of
    floats, one per label (raw logits when ``use_activation=False``); ``data`` the same as
    a float32 tensor; ``id2label`` the checkpoint config's label names (set by
    ``LLM.classify``; empty when unknown), ``label`` the name of the most likely class."""

    data: torch.Tensor
    id2label: dict[int, str] = field(default_factory=dict)

    @property
    def probs(self) -> list[float]:
        return self.data.tolist()

    @property
    def num_classes(self) -> int:
        return int(self.data.shape[-1])

    @property
    def label(self) -> str | None:
        return self.id2label.get(int(self.data.argmax())) if self.id2label else None


@dataclass(slots=True)
class PoolingOutput:
    """A reward model's scores (vLLM's PoolingOutput): ``data`` a float32 tensor,
    ``[num_labels]`` for a last-token reward head, ``[num_prompt_tokens, num_labels]`` for
    a per-token one; raw unless the request set ``use_activation=True``."""

    data: torch.Tensor


@dataclass(slots=True)
class ScoringOutput:
    """One pair's relevance (vLLM's ScoringOutput): a cross-encoder's activated logit, or
    the cosine similarity of two embeddings."""

    score: float


@dataclass(slots=True)
class PoolingRequestOutput:
    """A pooling request's result (vLLM's PoolingRequestOutput); the subclasses name what
    ``outputs`` holds. ``finish_reason`` is "stop", or "abort" / "error" when nothing was
    made (``outputs`` is then None). ``req_id`` and ``num_preemptions`` are core-runner
    extras."""

    request_id: str
    outputs: Any
    prompt_token_ids: list[int]
    finished: bool
    prompt: str | None = None
    finish_reason: str | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0

    @property
    def req_id(self) -> str:
        return self.request_id


@dataclass(slots=True)
class EmbeddingRequestOutput(PoolingRequestOutput):
    """An embedding request's result: ``outputs`` an EmbeddingOutput (vLLM's EmbeddingRequestOutput)."""


@dataclass(slots=True)
class ClassificationRequestOutput(PoolingRequestOutput):
    """A classify request's result: ``outputs`` a ClassificationOutput (vLLM's name)."""


@dataclass(slots=True)
class ScoringRequestOutput(PoolingRequestOutput):
    """One scored pair: ``outputs`` a ScoringOutput (vLLM's name); ``prompt_token_ids`` the
    pair's tokens for a cross-encoder, the two texts' tokens one after the other for an
    embedding model (as vLLM)."""
