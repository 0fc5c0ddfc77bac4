"""AsyncMPClient: AsyncLLM's interface over an engine core in its own process (vLLM's name).

The API process (this one) tokenizes and validates (``CoreFacts.input_processor``), sends
each request to the core as an ``EngineCoreRequest`` on a PUSH socket, and reads the
core's per-step ``EngineCoreOutputs`` on a PULL socket in a dedicated thread, which hands
every batch it read to the event loop with one ``call_soon_threadsafe``; the loop turns the
outputs into ``Delta``s (``ApiRequest``: detokenization and stop strings happen here) on
the same ``RequestStream``s ``AsyncLLM`` returns. So the HTTP loop and the engine never
share a GIL.

Faults: the reader thread polls the core's process sentinel with the sockets; when the core
dies, every open stream raises RuntimeError naming the exit code, ``is_running`` turns
false (``/health`` answers 503) and ``start`` raises RuntimeError (the handlers' 503).
Sends never block (a core that cannot take input is reported, not waited for), the wait
for the core's ready message is bounded by the process's life and ``ready_timeout``, and
``close`` kills a core that does not exit within its timeout.
"""
from __future__ import annotations

import asyncio
import atexit
import dataclasses
import importlib
import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from typing import Any, Callable, Sequence

from core_runner.engine import core_messages as M
from core_runner.engine.api_request import ApiRequest
from core_runner.engine.core_facts import CoreFacts
from core_runner.engine.request_stream import RequestStream, StreamingClient
from core_runner.executor.multiproc import _main_module_hidden
from core_runner.pooling_params import PoolingParams
from core_runner.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# how often the reader thread wakes to look at the core's process when no output comes (s)
POLL_S = 0.1
# the default bound on the core's start (loading a large checkpoint can take many minutes)
READY_TIMEOUT_S = 1800.0


ENV_SWITCH = "CORE_RUNNER_ENABLE_MULTIPROCESSING"


def multiprocessing_enabled() -> bool:
    """Whether ``core-runner serve`` runs the engine core in its own process: yes unless
    CORE_RUNNER_ENABLE_MULTIPROCESSING=0 (vLLM's VLLM_ENABLE_V1_MULTIPROCESSING), read at call time."""
    value = os.environ.get(ENV_SWITCH, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{ENV_SWITCH}={value!r} is invalid: expected 1 (the engine core in its own process, the "
                         "default) or 0 (the engine in the server's process)")
    return value == "1"


def require_zmq() -> Any:
    M.require_msgspec()
    try:
        import zmq
    except ImportError:  # pragma: no cover - the GPU image
        raise RuntimeError("install pyzmq and msgspec to run the engine core in its own process, or set "
                           "CORE_RUNNER_ENABLE_MULTIPROCESSING=0 to keep it in the server's process") from None
    return zmq


def rebuild_error(f: Any) -> BaseException:
    """The core's exception as its own type where that type takes a message (ValueError,
    OSError, CheckpointError, ...), else a RuntimeError naming it; the core's traceback is a note."""
    cls: Any = None
    try:
        cls = importlib.import_module(f.exc_module)
        for part in f.exc_type.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError):
        cls = None
    err: BaseException | None = None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            err = cls(f.message)
        except Exception:  # a constructor that wants other arguments
            err = None
    if err is None:
        err = RuntimeError(f"the engine core failed with {f.exc_type}: {f.message}")
    if f.traceback:
        err.add_note(f"in the engine core process:\n{f.traceback}")
    return err


class AsyncMPClient(StreamingClient):
    """``start`` / ``generate`` / ``embed`` / ``abort`` / ``abort_all`` / ``close`` as
    ``AsyncLLM``'s, over a core process built from ``LLM(model, **options)``; ``engine``
    holds the facts the handlers read (``CoreFacts``). The constructor returns once the core
    is ready and raises the core's own error when it could not start."""

    def __init__(self, model: str, options: dict[str, Any] | None = None, *, stats: Any = None,
                 request_timeout: float | None = None, logits_processors: Sequence[str] = (),
                 ready_timeout: float = READY_TIMEOUT_S) -> None:
        zmq = require_zmq()
        self._zmq = zmq
        self.stats, self.request_timeout = stats, request_timeout
        self.num_aborted = 0
        self._reqs: dict[str, ApiRequest] = {}  # event-loop thread only
        self._active: set[str] = set()
        self._ids = 0
        self._closed = False
        self._dead: str | None = None  # why the core is gone (set by the reader thread)
        self._refusing: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._send_lock = threading.Lock()
        self._dir = tempfile.mkdtemp(prefix="core-runner-ipc-")
        self._ctx = zmq.Context()
        self._in = self._ctx.socket(zmq.PUSH)
        self._in.setsockopt(zmq.SNDHWM, 0)  # never block the event loop on a full queue
        self._in.bind(f"ipc://{self._dir}/input")
        self._out = self._ctx.socket(zmq.PULL)
        self._out.setsockopt(zmq.RCVHWM, 0)
        self._out.bind(f"ipc://{self._dir}/output")
        from core_runner.engine.core_proc import run_engine_core

        spawn = multiprocessing.get_context("spawn")  # torch, CUDA and tokenizers' pools are not fork-safe
        self._proc = spawn.Process(
            target=run_engine_core, name="core-runner-engine-core",
            args=(str(model), dict(options or {}), list(logits_processors), f"ipc://{self._dir}/input",
                  f"ipc://{self._dir}/output", os.getpid(), logging.getLogger("core_runner").getEffectiveLevel()))
        with _main_module_hidden():  # the core needs nothing of the caller's script (which may lack a main guard)
            self._proc.start()
        atexit.register(self.close)  # before multiprocessing's own exit hook joins the child
        try:
            self.engine = CoreFacts(self._wait_ready(ready_timeout))
        except BaseException:
            self.close(timeout=5.0)
            raise
        self._thread = threading.Thread(target=self._read, name="core-runner-core-outputs", daemon=True)
        self._thread.start()

    # ---- start-up ---------------------------------------------------------------------
    def _wait_ready(self, timeout: float) -> Any:
        zmq = self._zmq
        poller = zmq.Poller()
        poller.register(self._out, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            if poller.poll(int(POLL_S * 1000)):
                msg = M.decode_from_core(self._out.recv())
                if isinstance(msg, M.EngineCoreReady):
                    logger.info("engine core ready in process %d: %s", msg.pid, msg.architecture)
                    return msg
                if isinstance(msg, M.EngineCoreFailed):
                    raise rebuild_error(msg)
                continue
            if not self._proc.is_alive():
                raise RuntimeError(f"the engine core process exited with code {self._proc.exitcode} before it "
                                   "was ready (see its log above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine core was not ready within {timeout} s (ready_timeout)")

    # ---- caller side (the event loop) -------------------------------------------------
    def start(
        self, prompt: str | Sequence[int], sampling_params: SamplingParams | None = None,
        request_id: str | None = None, *, pooling_params: PoolingParams | None = None,
        timeout: float | None = None,
    ) -> RequestStream:
        """As ``AsyncLLM.start``: validate here, queue in the core, return the request's stream."""
        if self._refusing is not None:
            raise RuntimeError(self._refusing)
        if not self.is_running:
            raise RuntimeError(self._dead or "the engine core is not running (AsyncMPClient was closed)")
        eng = self.engine
        params, request_id = self._params_and_id(eng, sampling_params, request_id, pooling_params)
        grammar = params.structured_outputs if params is not None else None
        if grammar is not None:  # compiled by the core, which holds the matcher; not a second time here
            params = dataclasses.replace(params, structured_outputs=None)
        req = eng.input_processor.process(prompt, params, request_id, pooling_params)
        sp = req.sampling_params
        if grammar is not None:
            sp = dataclasses.replace(sp, structured_outputs=grammar)
        loop = self._bind_loop()
        q: asyncio.Queue = asyncio.Queue()
        self._send(M.EngineCoreRequest(request_id, req.prompt_token_ids, sp, req.pooling_params, time.time(),
                                       req.seed))
        self._reqs[request_id] = ApiRequest(request_id, sp, len(req.prompt_token_ids), eng.tokenizer,
                                            eng.eos_token_ids, q)
        self._active.add(request_id)
        if self.stats is not None:
            self.stats.on_tokens(prompt=len(req.prompt_token_ids), generation=0)
        timeout = self.request_timeout if timeout is None else timeout
        deadline = None if timeout is None else loop.time() + timeout
        return RequestStream(request_id, q, deadline, self._abort_one, self._release)

    async def abort(self, request_id: str) -> None:
        self._abort_one(request_id)

    def abort_all(self, reason: str) -> None:
        """Abort every request (the core answers each with its final "abort" output) and
        refuse new ones with RuntimeError(reason)."""
        self._refusing = reason
        if self._reqs and self.is_running:
            self.num_aborted += len(self._reqs)
            self._send(M.EngineCoreAbort(list(self._reqs)), quiet=True)

    @property
    def num_requests(self) -> int:
        return len(self._active)

    @property
    def is_running(self) -> bool:
        return not self._closed and self._dead is None

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        raise NotImplementedError(
            "AsyncMPClient.call(fn) would run fn on the engine, which lives in the engine core process (functions "
            "are not sent across processes); set CORE_RUNNER_ENABLE_MULTIPROCESSING=0 or use create_app(engine) to "
            "inspect the engine in-process")

    def close(self, timeout: float = 10.0) -> None:
        """Tell the core to shut down, wait up to ``timeout`` s for it, kill it past that."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._send(M.EngineCoreShutdown(), quiet=True)
        self._proc.join(timeout)
        if self._proc.is_alive():
            logger.warning("the engine core did not exit within %s s of the shutdown: killing it", timeout)
            self._proc.kill()
            self._proc.join(5.0)
        thread = getattr(self, "_thread", None)
        if thread is not None:
            thread.join(2 * POLL_S + 1.0)
        self._in.close(linger=0)
        self._out.close(linger=0)
        self._ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)
        self._fail_all_threadsafe("the engine core was shut down (AsyncMPClient was closed)")

    # ---- internals --------------------------------------------------------------------
    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed() and self._reqs:
                raise RuntimeError("AsyncMPClient serves one event loop at a time, and another one has requests "
                                   "running")
            self._loop = loop
        return loop

    def _send(self, msg: Any, quiet: bool = False) -> None:
        try:
            with self._send_lock:
                self._in.send(M.encode(msg), self._zmq.NOBLOCK)
        except self._zmq.ZMQError as e:  # no core reading (dead, or not connected): never wait for it
            if quiet:
                return
            raise RuntimeError(f"the engine core does not take requests ({e}): {self._dead or 'not connected'}") \
                from None

    def _abort_one(self, request_id: str) -> None:
        if request_id in self._reqs and self.is_running:
            self.num_aborted += 1
            self._send(M.EngineCoreAbort([request_id]), quiet=True)

    def _release(self, request_id: str, abort: bool) -> None:
        """A stream is done with its request (``abort``: before its final delta)."""
        self._active.discard(request_id)
        if abort:
            self._abort_one(request_id)
            self._reqs.pop(request_id, None)  # its later outputs are nobody's

    # ---- the reader thread ------------------------------------------------------------
    def _read(self) -> None:
        zmq = self._zmq
        poller = zmq.Poller()
        poller.register(self._out, zmq.POLLIN)
        poller.register(self._proc.sentinel, zmq.POLLIN)
        while not self._closed:
            try:
                ready = dict(poller.poll(int(POLL_S * 1000)))
            except zmq.ZMQError:  # the sockets were closed under us: close() runs
                return
            batch = []
            while self._out in ready:
                try:
                    batch.append(M.decode_from_core(self._out.recv(zmq.NOBLOCK)))
                except zmq.Again:
                    break
                except Exception:
                    logger.exception("dropped a malformed message from the engine core")
            outputs = [m for m in batch if isinstance(m, M.EngineCoreOutputs)]
            if outputs:
                self._to_loop(self._on_outputs, outputs)
            fatal = next((m for m in batch if isinstance(m, M.EngineCoreFailed)), None)
            if fatal is not None:
                self._die(f"the engine core failed: {fatal.exc_type}: {fatal.message}")
                return
            if not batch and self._proc.sentinel in ready and not self._proc.is_alive() and not self._closed:
                self._die(f"the engine core process died (exit code {self._proc.exitcode})")
                return

    def _die(self, why: str) -> None:
        logger.error("%s: open requests fail, /health answers 503", why)
        self._dead = why
        self._fail_all_threadsafe(why)

    def _fail_all_threadsafe(self, why: str) -> None:
        self._to_loop(self._fail_all, why)

    def _to_loop(self, fn: Callable[..., None], arg: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # no request was ever started on a live loop: nothing to tell
        try:
            loop.call_soon_threadsafe(fn, arg)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def _fail_all(self, why: str) -> None:
        for r in self._reqs.values():
            r.queue.put_nowait(RuntimeError(why))
        self._reqs.clear()

    def _on_outputs(self, messages: list[Any]) -> None:
        """One batch of the core's step messages, on the event loop."""
        cut = []
        now = time.perf_counter()
        for msg in messages:
            for out in msg.outputs:
                r = self._reqs.get(out.request_id)
                if r is None:
                    continue  # closed, cut by a stop string or failed here already
                self._observe(r, len(out.new_token_ids), now)
                d = r.feed(out)
                if d is None:
                    continue
                if isinstance(d, BaseException) or d.finished:
                    del self._reqs[out.request_id]
                    if r.cut and out.finish_reason is None:
                        cut.append(out.request_id)
                r.queue.put_nowait(d)
            self._report(msg)
        if cut and self.is_running:
            self._send(M.EngineCoreAbort(cut), quiet=True)

    def _report(self, msg: Any) -> None:
        if self.stats is None:
            return
        self.stats.on_step(msg.num_running, msg.num_waiting, msg.kv_cache_usage)
        self.stats.on_prefix_cache(msg.prefix_cache_queries, msg.prefix_cache_hits)
        if msg.spec_drafts or msg.spec_draft_tokens or msg.spec_accepted_tokens:
            self.stats.on_spec_decode(msg.spec_drafts, msg.spec_draft_tokens, msg.spec_accepted_tokens)
