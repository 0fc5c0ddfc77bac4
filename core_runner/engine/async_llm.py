"""AsyncLLM: the engine behind an asyncio front end (the OpenAI server).

Threading model: the LLMEngine is not thread-safe, so exactly one thread, the *engine
thread*, ever touches it after construction. asyncio callers never call the engine;
they put commands (add a request, abort one, run a function) on a queue that the engine
thread drains before each step. The engine thread steps while requests exist and sleeps
on the queue when none do. After each step it reads every tracked request's new tokens
and hands a ``Delta`` to the caller's event loop with ``call_soon_threadsafe``; the
caller reads them from a ``RequestStream`` (``start``) or the ``generate`` iterator.

Per-step tokens come from the live ``Request`` objects: the InputProcessor's Request is
the one the scheduler appends sampled tokens to, so after ``step()`` the tokens a
request gained are ``req.output_token_ids[already_sent:]``. No engine file is changed;
the finished requests still come from ``step()``'s outputs (whose fields are read by
``final_fields`` alone).

Prompt validation (``input_processor.process``) runs on the caller's thread, so a bad
request raises in ``start`` before anything is queued; the engine thread never uses
the InputProcessor. ``start`` does not wait for the engine: a server starting many
requests for one client can watch that client's connection between them.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from core_runner.engine.detokenizer import StreamingText
from core_runner.engine.llm_engine import LLMEngine
from core_runner.engine.request import Request
from core_runner.engine.request_stream import Delta, RequestStream, StreamingClient
from core_runner.pooling_params import PoolingParams
from core_runner.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

@dataclass(slots=True)
class FinalFields:
    text: str
    token_ids: list[int]
    finish_reason: str
    stop_reason: int | str | None
    cumulative_logprob: float | None
    embedding: Any


def final_fields(out: Any) -> FinalFields:
    """The one place that reads the engine's finished-request record: vLLM's shape, a
    RequestOutput's ``outputs[0]`` (one sample: AsyncLLM serves n = 1) or an
    EmbeddingRequestOutput's ``outputs.data``."""
    if not isinstance(out.outputs, list):  # an embedding; no vector when it was aborted or failed
        data = None if out.outputs is None else out.outputs.data
        return FinalFields(text="", token_ids=[], finish_reason=out.finish_reason or "stop", stop_reason=None,
                           cumulative_logprob=None, embedding=data)
    first = out.outputs[0]
    return FinalFields(
        text=first.text, token_ids=list(first.token_ids), finish_reason=first.finish_reason or "stop",
        stop_reason=first.stop_reason, cumulative_logprob=first.cumulative_logprob, embedding=None,
    )


def output_request_id(out: Any) -> str:
    """The request id of a finished-request record."""
    return out.request_id


class EngineStats(Protocol):
    """What the engine thread reports (the server's /metrics implements it)."""

    def on_step(self, num_running: int, num_waiting: int, kv_cache_usage: float) -> None: ...
    def on_tokens(self, prompt: int, generation: int) -> None: ...
    def on_prefix_cache(self, queries: int, hits: int) -> None: ...
    def on_spec_decode(self, drafts: int, draft_tokens: int, accepted_tokens: int) -> None: ...
    def on_first_token(self, seconds: float) -> None: ...
    def on_inter_token(self, seconds: float) -> None: ...


@dataclass(slots=True)
class _Tracked:
    req: Request
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    text: StreamingText | None
    # streamed text may later be cut by a stop string, so this many characters are held back
    hold: int = 0
    sent_tokens: int = 0
    decoded: str = ""
    sent_text: str = ""
    arrival: float = field(default_factory=time.perf_counter)
    last_token_time: float | None = None


class AsyncLLM(StreamingClient):
    """``generate`` / ``embed`` as async iterators over one LLMEngine, driven by one
    engine thread (see the module docstring). ``request_timeout`` (seconds, None = no
    limit) aborts a request that runs longer; ``close()`` stops the thread."""

    def __init__(self, engine: LLMEngine, *, stats: EngineStats | None = None,
                 request_timeout: float | None = None) -> None:
        self.engine = engine
        self.stats = stats
        self.request_timeout = request_timeout
        self._commands: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._tracked: dict[str, _Tracked] = {}  # engine thread only
        self._active: set[str] = set()  # caller side: ids in use
        self._ids = 0
        self._flush = False
        self._closed = False
        self._refusing: str | None = None  # why new requests are refused (see abort_all)
        self.num_aborted = 0  # requests ended by abort (by id, disconnect, timeout)
        # the scheduler's prefix-cache counters as last reported: stats get the growth since,
        # so work the engine did before this AsyncLLM (a warm-up) is not counted
        self._prefix_cache_reported = (engine.scheduler.prefix_cache_queries, engine.scheduler.prefix_cache_hits)
        self._spec_reported = _spec_counts(engine.scheduler)
        self._thread = threading.Thread(target=self._run, name="core-runner-engine", daemon=True)
        self._thread.start()

    # ---- caller side ----------------------------------------------------------------
    def start(
        self, prompt: str | Sequence[int], sampling_params: SamplingParams | None = None,
        request_id: str | None = None, *, pooling_params: PoolingParams | None = None,
        timeout: float | None = None,
    ) -> RequestStream:
        """Validate one prompt and queue its request now (no await: a caller starting many
        requests watches its client in between). Invalid input raises ValueError and
        nothing is queued; a closed or shut-down AsyncLLM raises RuntimeError. The
        returned stream must be read to its final delta or closed (``aclose``: aborts)."""
        if self._refusing is not None:
            raise RuntimeError(self._refusing)
        if self._closed or not self._thread.is_alive():
            raise RuntimeError("the engine thread is not running (AsyncLLM was closed or its loop failed)")
        params, request_id = self._params_and_id(self.engine, sampling_params, request_id, pooling_params)
        req = self.engine.input_processor.process(prompt, params, request_id, pooling_params)
        loop = asyncio.get_running_loop()
        text = StreamingText(self.engine.tokenizer) if params is not None else None
        hold = max((len(s) for s in params.stop), default=1) - 1 if params is not None and params.stop else 0
        tracked = _Tracked(req, loop, asyncio.Queue(), text, hold)
        self._active.add(request_id)
        self._commands.put(lambda: self._add(tracked))
        timeout = self.request_timeout if timeout is None else timeout
        deadline = None if timeout is None else loop.time() + timeout
        return RequestStream(request_id, tracked.queue, deadline, self._queue_abort, self._release)

    async def abort(self, request_id: str) -> None:
        """Abort a request by id; its stream ends with finish_reason="abort". Unknown ids are ignored."""
        self._queue_abort(request_id)

    def abort_all(self, reason: str) -> None:
        """Abort every request (their streams end with finish_reason="abort") and refuse
        new ones from now on with RuntimeError(reason): the end of a shutdown's grace."""
        self._refusing = reason
        self._commands.put(self._abort_all)

    @property
    def num_requests(self) -> int:
        """Requests started and not yet read to their end or closed."""
        return len(self._active)

    async def call(self, fn: Callable[[LLMEngine], Any]) -> Any:
        """Run ``fn(engine)`` on the engine thread between steps (inspection: debug.rows(), ...)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def run() -> None:
            try:
                res = fn(self.engine)
            except BaseException as e:  # handed to the caller
                loop.call_soon_threadsafe(_set, fut, None, e)
            else:
                loop.call_soon_threadsafe(_set, fut, res, None)

        self._commands.put(run)
        return await fut

    def close(self, timeout: float = 10.0) -> None:
        self._closed = True
        self._commands.put(None)
        self._thread.join(timeout)

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    def _queue_abort(self, request_id: str) -> None:
        self._commands.put(lambda: self._abort(request_id))

    def _release(self, request_id: str, abort: bool) -> None:
        """A stream is done with its request (``abort``: before its final delta)."""
        self._active.discard(request_id)
        if abort:
            self._queue_abort(request_id)

    # ---- engine thread --------------------------------------------------------------
    def _run(self) -> None:
        eng = self.engine
        while True:
            busy = eng.has_unfinished_requests() or self._flush
            try:
                cmd = self._commands.get(block=not busy, timeout=None)
            except queue.Empty:
                cmd = False
            while cmd is not False:
                if cmd is None:
                    self._fail_all(RuntimeError("AsyncLLM was closed"))
                    return
                try:
                    cmd()
                except Exception:  # a command's failure is reported by the command itself
                    logger.exception("engine command failed")
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    cmd = False
            if not (eng.has_unfinished_requests() or self._flush):
                self._report_step()
                continue
            # one more step after an abort sends the runner the finished ids (frees the row)
            self._flush = False
            try:
                finished = eng.step()
            except Exception:
                logger.exception("engine step failed; its requests end with finish_reason='error'")
                for rid in list(self._tracked):
                    self._end(rid, "error")
                self._flush = True
                continue
            self._publish(finished)
            self._report_step()

    def _add(self, t: _Tracked) -> None:
        rid = t.req.req_id
        try:
            self.engine.add_processed(t.req)
        except Exception as e:
            t.loop.call_soon_threadsafe(t.queue.put_nowait, e)
            return
        self._tracked[rid] = t
        if self.stats is not None:
            self.stats.on_tokens(prompt=len(t.req.prompt_token_ids), generation=0)

    def _abort(self, rid: str) -> None:
        if rid in self._tracked:
            self.engine.abort_request(rid)
            self._flush = True
            self.num_aborted += 1
            self._end(rid, "abort")

    def _abort_all(self) -> None:
        for rid in list(self._tracked):
            self._abort(rid)

    def _end(self, rid: str, reason: str) -> None:
        """Finish a tracked request that the engine did not report as finished."""
        t = self._tracked.pop(rid)
        if reason != "abort":
            self.engine.abort_request(rid)
        new = t.req.output_token_ids[t.sent_tokens:]
        self._decode(t, new)
        self._emit(t, Delta(
            rid, new, t.decoded[len(t.sent_text):], finished=True, finish_reason=reason,
            num_prompt_tokens=len(t.req.prompt_token_ids), num_output_tokens=len(t.req.output_token_ids),
            logprobs=self._logprobs(t, len(new)),
        ))

    def _fail_all(self, err: BaseException) -> None:
        for rid in list(self._tracked):
            t = self._tracked.pop(rid)
            t.loop.call_soon_threadsafe(t.queue.put_nowait, err)

    def _decode(self, t: _Tracked, tokens: list[int]) -> None:
        if t.text is not None:
            for tok in tokens:
                t.decoded += t.text.add(tok)

    def _logprobs(self, t: _Tracked, n_new: int) -> list[dict[int, float]] | None:
        lps = t.req.logprobs
        if lps is None:
            return None
        return lps[t.sent_tokens:t.sent_tokens + n_new]  # aligned with output_token_ids

    def _publish(self, finished: list[Any]) -> None:
        done = {output_request_id(o): o for o in finished}
        now = time.perf_counter()
        for rid, t in list(self._tracked.items()):
            out = done.get(rid)
            new = t.req.output_token_ids[t.sent_tokens:]
            self._observe(t, len(new), now)
            if out is None:
                if not new:
                    continue
                self._decode(t, new)
                lps = self._logprobs(t, len(new))
                t.sent_tokens += len(new)
                upto = max(len(t.sent_text), len(t.decoded) - t.hold)
                piece = t.decoded[len(t.sent_text):upto]
                t.sent_text += piece
                self._emit(t, Delta(rid, new, piece, num_prompt_tokens=len(t.req.prompt_token_ids),
                                    num_output_tokens=t.sent_tokens, logprobs=lps))
                continue
            del self._tracked[rid]
            f = final_fields(out)
            lps = self._logprobs(t, len(new))
            if f.text.startswith(t.sent_text):
                rest = f.text[len(t.sent_text):]
            else:  # the streamed text and the engine's final text disagree: keep the stream consistent
                logger.warning("request %r: streamed text %r is not a prefix of the final text %r",
                               rid, t.sent_text, f.text)
                rest = ""
            self._emit(t, Delta(
                rid, f.token_ids[t.sent_tokens:], rest, finished=True, finish_reason=f.finish_reason,
                stop_reason=f.stop_reason, num_prompt_tokens=len(t.req.prompt_token_ids),
                num_output_tokens=len(f.token_ids), logprobs=lps, cumulative_logprob=f.cumulative_logprob,
                embedding=f.embedding,
            ))

    @staticmethod
    def _emit(t: _Tracked, d: Delta) -> None:
        try:
            t.loop.call_soon_threadsafe(t.queue.put_nowait, d)
        except RuntimeError:  # the caller's loop is closed: nobody is listening
            pass

    def _report_step(self) -> None:
        if self.stats is None:
            return
        sch = self.engine.scheduler
        total = self.engine.num_blocks  # 0: a model without paged layers uses no KV cache
        self.stats.on_step(len(sch.running), len(sch.waiting), 1.0 - sch.pool.num_free / total if total else 0.0)
        queries, hits = sch.prefix_cache_queries, sch.prefix_cache_hits
        last_queries, last_hits = self._prefix_cache_reported
        self._prefix_cache_reported = (queries, hits)
        self.stats.on_prefix_cache(queries - last_queries, hits - last_hits)
        spec, last = _spec_counts(sch), self._spec_reported
        self._spec_reported = spec
        if spec != last:
            self.stats.on_spec_decode(*(a - b for a, b in zip(spec, last)))


def _spec_counts(sch: Any) -> tuple[int, int, int]:
    """The scheduler's speculative-decoding counters: steps that verified, proposed, accepted."""
    return sch.spec_num_drafts, sch.spec_num_draft_tokens, sch.spec_num_accepted_tokens


def _set(fut: asyncio.Future, res: Any, err: BaseException | None) -> None:
    if fut.done():
        return
    if err is not None:
        fut.set_exception(err)
    else:
        fut.set_result(res)
