"""The requests of one HTTP request: started together, read together, closed together.

A completion with n choices or a list of prompts, or an embeddings list, is many engine
requests. They are started without waiting for any first token (``start_all``), with the
client's connection checked between batches, so a client that leaves while they start
(or while they wait for a row) gets every one of them aborted. Closing what ``merge``
yields closes every stream, which aborts whatever has not finished.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable, Sequence

from fastapi import Request

from core_runner.engine.async_llm import AsyncLLM
from core_runner.engine.request_stream import Delta, RequestStream

# engine requests validated and queued between two looks at the event loop and the client
START_BATCH = 32
# how often a non-streamed request checks that its client is still connected
DISCONNECT_POLL_S = 0.1


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


class StartError(Exception):
    """Request ``index`` of a ``start_all`` was refused with ``error`` (a ValueError)."""

    def __init__(self, index: int, error: ValueError) -> None:
        super().__init__(str(error))
        self.index, self.error = index, error


async def start_all(llm: AsyncLLM, request: Request, n: int,
                    start_one: Callable[[int], RequestStream]) -> list[RequestStream]:
    """``start_one(0..n-1)`` (each an ``AsyncLLM.start``), yielding to the event loop and
    checking the client every ``START_BATCH``. All or none: on a refusal (StartError),
    a disconnect (ClientGone) or cancellation the ones started are closed (aborted)."""
    started: list[RequestStream] = []
    try:
        for i in range(n):
            try:
                started.append(start_one(i))
            except ValueError as e:
                raise StartError(i, e) from None
            if i % START_BATCH == START_BATCH - 1 and i + 1 < n:
                await asyncio.sleep(0)  # /metrics, /health and other requests are served meanwhile
                if await request.is_disconnected():
                    raise ClientGone()
    except BaseException:
        await close_all(started)
        raise
    return started


async def close_all(streams: Sequence[RequestStream]) -> None:
    for s in streams:
        await s.aclose()


async def merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, Delta]]:
    """(index, delta) from several streams as they come; closing this closes them all
    (so their requests are aborted)."""
    if len(streams) == 1:
        try:
            async for d in streams[0]:
                yield 0, d
        finally:
            await streams[0].aclose()
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, s: RequestStream) -> None:
        try:
            async for d in s:
                await q.put((i, d))
        except BaseException as e:
            await q.put((i, e))
            raise
        finally:
            await s.aclose()

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            i, d = await q.get()
            if isinstance(d, BaseException):
                raise d
            left -= d.finished
            yield i, d
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await close_all(streams)  # a pump cancelled before it ran never closed its stream


async def collect_while_connected(request: Request, streams: list[RequestStream]) -> list[Delta]:
    """``collect``, aborting the requests when the client disconnects meanwhile (a
    non-streamed request is otherwise never cancelled by the server)."""
    task = asyncio.ensure_future(collect(streams))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()  # merge closes every stream: AsyncLLM aborts their requests
            await asyncio.gather(task, return_exceptions=True)


async def collect(streams: list[RequestStream]) -> list[Delta]:
    """Each stream's whole output as one Delta (text and tokens joined)."""
    out: list[Delta | None] = [None] * len(streams)
    async for i, d in merge(streams):
        acc = out[i]
        if acc is None:
            out[i] = d
            continue
        acc.token_ids += d.token_ids  # in place: Delta.then would copy the whole output each time
        acc.text += d.text
        if d.logprobs is not None:
            if acc.logprobs is None:
                acc.logprobs = []
            acc.logprobs.extend(d.logprobs)
        for f in ("finished", "finish_reason", "stop_reason", "num_output_tokens", "cumulative_logprob",
                  "embedding"):
            setattr(acc, f, getattr(d, f))
    return out


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"
