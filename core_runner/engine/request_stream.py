"""What a caller of AsyncLLM reads: one request's ``Delta``s through a ``RequestStream``.

The stream lives on the caller's event loop; the engine thread only puts deltas (or an
exception) on its queue. Closing a stream before its final delta aborts the request.
"""
from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Sequence


@dataclass(slots=True)
class Delta:
    """What one step added to a request. ``text`` and ``token_ids`` are new since the
    previous delta; the final delta (``finished``) carries the rest, with
    ``finish_reason`` ("stop", "length", "abort", "error", ...). ``logprobs`` holds one
    {token id: logprob} per new token when logprobs were asked for."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # all so far
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float | None = None
    embedding: Any = None

    def then(self, later: Delta) -> Delta:
        """This delta followed by ``later`` (of the same request) as one: the new tokens,
        text and logprobs of both; the counts and the ending of the later."""
        lps = None if self.logprobs is None and later.logprobs is None else \
            (self.logprobs or []) + (later.logprobs or [])
        return Delta(self.request_id, self.token_ids + later.token_ids, self.text + later.text, later.finished,
                     later.finish_reason, later.stop_reason, later.num_prompt_tokens, later.num_output_tokens,
                     lps, later.cumulative_logprob, later.embedding)


class RequestStream:
    """The deltas of one queued request (``AsyncLLM.start``), the last with
    ``finished=True``; ``aclose()`` before that aborts the request. A consumer that fell
    behind gets its queued deltas merged into one (as vLLM's output collector merges
    them), so a loop serving many streams sends fewer, larger events instead of falling
    further behind. Past its deadline the request is aborted and the final delta says
    finish_reason="abort"."""

    def __init__(self, request_id: str, q: asyncio.Queue, deadline: float | None,
                 abort: Callable[[str], None], release: Callable[[str, bool], None]) -> None:
        self.request_id = request_id
        self._q, self._deadline = q, deadline
        self._abort, self._release = abort, release  # the owner's: abort by id; done (and abort?)
        self._done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Delta:
        if self._done:
            raise StopAsyncIteration
        item = await self._get()
        if isinstance(item, BaseException):
            self._finish(abort=False)
            raise item
        error = None
        while not item.finished and not self._q.empty():
            later = self._q.get_nowait()
            if isinstance(later, BaseException):
                error = later
                break
            item = item.then(later)
        if error is not None:  # the tokens before it go out first; the error ends the stream next
            self._q.put_nowait(error)
        if item.finished:
            self._finish(abort=False)
            if item.embedding is not None:
                item.embedding = item.embedding.float().cpu()
        return item

    async def aclose(self) -> None:
        if not self._done:
            self._finish(abort=True)

    async def _get(self) -> Delta | BaseException:
        while True:
            if self._deadline is None:
                return await self._q.get()
            loop = asyncio.get_running_loop()
            try:
                return await asyncio.wait_for(self._q.get(), max(0.0, self._deadline - loop.time()))
            except TimeoutError:
                self._deadline = None  # the abort's final delta follows
                self._abort(self.request_id)

    def _finish(self, abort: bool) -> None:
        self._done = True
        self._release(self.request_id, abort)



class StreamingClient(ABC):
    """``generate`` / ``embed`` over ``start``, shared by the in-process ``AsyncLLM`` and the
    engine-core process's ``AsyncMPClient``, and their latency reports to ``stats``."""

    stats: Any = None

    @abstractmethod
    def start(self, prompt: str | Sequence[int], sampling_params: Any = None, request_id: str | None = None, *,
              pooling_params: Any = None, timeout: float | None = None) -> RequestStream:
        """Validate one prompt and queue its request now; its stream (see the subclasses)."""

    async def generate(
        self, prompt: str | Sequence[int], sampling_params: Any = None,
        request_id: str | None = None, *, timeout: float | None = None,
    ) -> AsyncIterator[Delta]:
        """Deltas of one request, the last with ``finished=True``. Invalid input raises
        ValueError before anything is queued. Stopping iteration (or cancelling the task)
        aborts the request; so does ``timeout`` (default: the client's ``request_timeout``),
        after which the final delta says finish_reason="abort"."""
        stream = self.start(prompt, sampling_params, request_id, timeout=timeout)
        try:
            async for d in stream:
                yield d
        finally:
            await stream.aclose()

    async def embed(self, prompt: str | Sequence[int], pooling_params: Any = None,
                    request_id: str | None = None, *, timeout: float | None = None) -> Delta:
        """The pooled vector of one prompt (``Delta.embedding``, a CPU float32 tensor)."""
        from core_runner.pooling_params import PoolingParams

        stream = self.start(prompt, None, request_id, pooling_params=pooling_params or PoolingParams(),
                            timeout=timeout)
        last = None
        try:
            async for d in stream:
                last = d
        finally:
            await stream.aclose()
        return last

    def _params_and_id(self, engine: Any, sampling_params: Any, request_id: str | None,
                       pooling_params: Any) -> tuple[Any, str]:
        """A request's sampling params (the model's defaults when None; None for a pooling
        request) and its id (``async-N`` when None); ValueError for a task the model (``engine``:
        ``tasks``, ``default_sampling_params``) lacks or an id already in use."""
        if pooling_params is None:
            if "generate" not in engine.tasks:
                raise ValueError(f"the model's tasks are {list(engine.tasks)}: it cannot generate text")
            params = sampling_params if sampling_params is not None else engine.default_sampling_params()
        else:
            task = pooling_params.task or "embed"
            if task not in engine.tasks:
                raise ValueError(f"the model's tasks are {list(engine.tasks)}: it cannot {task}")
            params = None
        if request_id is None:
            self._ids += 1
            request_id = f"async-{self._ids}"
        if request_id in self._active:
            raise ValueError(f"request id {request_id!r} is already in use")
        return params, request_id

    def _observe(self, tracked: Any, n_new: int, now: float) -> None:
        """Report ``n_new`` tokens of one request that arrived at ``now`` (``time.perf_counter``):
        the first token's latency from ``tracked.arrival``, else the gap since its last tokens
        split evenly over the new ones (vLLM's inter-token latency)."""
        if self.stats is None or n_new == 0:
            return
        self.stats.on_tokens(prompt=0, generation=n_new)
        if tracked.last_token_time is None:
            self.stats.on_first_token(now - tracked.arrival)
        else:
            for _ in range(n_new):
                self.stats.on_inter_token((now - tracked.last_token_time) / n_new)
        tracked.last_token_time = now
