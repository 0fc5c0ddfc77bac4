"""The engine-core process: an LLMEngine (scheduler + runner + executor) behind two ZMQ
sockets (docs/engine_core_process.md).

``run_engine_core`` is the process's entry (spawned by ``AsyncMPClient``): it builds the
engine from the same model and options the CLI gives ``LLM``, sends ``EngineCoreReady``
(or ``EngineCoreFailed`` with the original error) and runs ``EngineCoreProc.run``: drain
the input socket (without blocking while requests run, blocking up to ``IDLE_POLL_MS``
when idle), ``step()``, send one ``EngineCoreOutputs`` with every request's new tokens
of that step. The core never tokenizes or detokenizes: prompts arrive as token ids, and
stop strings are matched by the API process (which sends an abort when it finds one).

The process ends on ``EngineCoreShutdown``, when its parent goes away (a watcher thread
polls ``os.getppid()``: a core must never outlive its API process), or after a fault
that leaves the engine unusable (``EngineCoreFailed`` with phase "fatal" goes out first).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import random
import signal
import threading
import time
import traceback
from typing import Any

from core_runner.engine import core_messages as M
from core_runner.engine.input_processor import prefix_cacheable, speculative
from core_runner.engine.request import Request
from core_runner.executor.errors import EngineDeadError
from core_runner.executor.gc_heap import freeze_gc_heap

logger = logging.getLogger(__name__)

# how long an idle core blocks on its input socket before looking again (ms)
IDLE_POLL_MS = 100
# how often the watcher thread checks that the parent process still lives (s)
PARENT_POLL_S = 0.5


def run_engine_core(model: str, options: dict[str, Any], logits_processors: list, input_addr: str,
                    output_addr: str, parent_pid: int, log_level: int) -> None:
    """The spawned process's body (see the module docstring)."""
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s [engine core]: %(message)s")
    # Ctrl-C in a terminal reaches the whole process group: the API process decides how the
    # server shuts down and tells the core, so the core does not die on the signal itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="core-runner-parent-watch", daemon=True).start()
    import zmq

    ctx = zmq.Context()
    out = ctx.socket(zmq.PUSH)
    out.connect(output_addr)
    inp = ctx.socket(zmq.PULL)
    inp.connect(input_addr)
    try:
        try:
            from core_runner.engine.llm import LLM

            engine = LLM(model, logits_processors=logits_processors, **options).engine
            ready = ready_message(engine)
        except BaseException as e:  # reported to the API process, which raises it again
            out.send(M.encode(failure("startup", e)))
            return
        out.send(M.encode(ready))
        freeze_gc_heap()  # this process lives as long as the engine: its start-up heap is for good
        try:
            EngineCoreProc(engine, inp, out).run()
        finally:
            engine.shutdown()
    finally:
        out.close(linger=2000)  # the last message (outputs, a failure) still goes out
        inp.close(linger=0)
        ctx.term()


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent_pid:  # re-parented: the API process is gone
            os._exit(0)


def failure(phase: str, e: BaseException) -> Any:
    cls = type(e)
    return M.EngineCoreFailed(phase, cls.__module__, cls.__qualname__, str(e),
                              "".join(traceback.format_exception(e)))


def ready_message(engine: Any) -> Any:
    """What the API process needs to serve without the weights (``EngineCoreReady``)."""
    from core_runner.loader import resolve_tokenizer

    ip, config = engine.input_processor, engine.config
    tok_path = str(resolve_tokenizer(config, engine.model_path)) if engine.tokenizer is not None else None
    try:
        hf_json = engine.hf_config.to_json_string(use_diff=False)
    except (TypeError, ValueError) as e:  # a config field JSON cannot hold: the API side reads no config fields
        logger.warning("the checkpoint config could not be sent to the API process (%s): labels are unknown there", e)
        hf_json = "{}"
    return M.EngineCoreReady(
        model=config.model, model_path=str(engine.model_path), tokenizer_path=tok_path,
        architecture=engine.architecture, tasks=list(engine.tasks), max_model_len=config.max_model_len,
        max_logprobs=config.max_logprobs, seed=config.seed, vocab_size=ip.vocab_size,
        eos_token_ids=list(ip.eos_token_ids), max_positions=ip.max_positions, chunked_prefill=ip.chunked_prefill,
        hf_config_json=hf_json, sampling_defaults=dict(engine.generation_defaults.sampling), pid=os.getpid(),
    )


@dataclasses.dataclass(slots=True)
class _Running:
    req: Request
    sent_tokens: int = 0


class EngineCoreProc:
    """The core's loop over one LLMEngine and its two sockets (``inp`` PULL, ``out`` PUSH)."""

    def __init__(self, engine: Any, inp: Any, out: Any) -> None:
        import zmq

        self.engine, self.inp, self.out = engine, inp, out
        self._zmq = zmq
        self.running: dict[str, _Running] = {}
        self.pending: list[Any] = []  # outputs decided between steps (refusals, aborts): sent with the next message
        self.flush = False  # one more step after an abort sends the runner the finished ids (frees the row)
        self.stop = False
        sch = engine.scheduler
        self._prefix = (sch.prefix_cache_queries, sch.prefix_cache_hits)
        self._spec = (sch.spec_num_drafts, sch.spec_num_draft_tokens, sch.spec_num_accepted_tokens)

    def run(self) -> None:
        poller = self._zmq.Poller()
        poller.register(self.inp, self._zmq.POLLIN)
        while not self.stop:
            busy = self.engine.has_unfinished_requests() or self.flush
            if busy or poller.poll(IDLE_POLL_MS):
                self._drain()
            if self.stop:
                break
            if not (self.engine.has_unfinished_requests() or self.flush):
                if self.pending:
                    self._send([])
                continue
            self.flush = False
            try:
                with self.engine.lock:
                    finished = self.engine.core.step()
            except EngineDeadError as e:  # the ranks can no longer agree: nothing more can run
                logger.error("the engine is dead (%s); ending every request with finish_reason='error'", e)
                self._end_all("error")
                self._send([])
                self.out.send(M.encode(failure("fatal", e)))
                return
            except Exception:
                logger.exception("engine step failed; its requests end with finish_reason='error'")
                self._end_all("error")
                self.flush = True
                self._send([])
                continue
            self._send(self._outputs(finished))

    # ---- input ----------------------------------------------------------------------
    def _drain(self) -> None:
        zmq = self._zmq
        while True:
            try:
                raw = self.inp.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = M.decode_to_core(raw)
            except Exception:  # a malformed message names no request we could answer: logged, dropped
                logger.exception("dropped a malformed message from the API process")
                continue
            if isinstance(msg, M.EngineCoreRequest):
                self._add(msg)
            elif isinstance(msg, M.EngineCoreAbort):
                for rid in msg.request_ids:
                    self._abort(rid)
            elif isinstance(msg, M.EngineCoreShutdown):
                self._end_all("abort")
                self.stop = True
                return

    def _add(self, m: Any) -> None:
        try:
            req = self._request(m)
            if m.request_id in self.running:
                raise ValueError(f"request id {m.request_id!r} is already running in the engine core")
            self.engine.add_processed(req)
        except (ValueError, TypeError) as e:  # the request's fault: its stream gets the message
            self.pending.append(M.EngineCoreOutput(m.request_id, [], finish_reason="error", refused=str(e)))
            return
        self.running[m.request_id] = _Running(req)

    def _request(self, m: Any) -> Request:
        """The engine Request of a message the API process validated. What only the core can
        decide happens here: the model's pooling defaults and the request's grammar matcher."""
        ip = self.engine.input_processor
        sp, pp = m.sampling_params, m.pooling_params
        if pp is not None:
            pp = ip.check_pooling_params(pp)
        grammar = None
        if sp is not None:
            if sp.stop:  # matched by the API process: a detokenizer here would cost the core's GIL
                sp = dataclasses.replace(sp, stop=[])
            if sp.structured_outputs is not None:
                grammar = ip.structured_outputs().request(sp.structured_outputs, self.engine.eos_token_ids)
        seed = m.seed if m.seed is not None else random.getrandbits(63)
        return Request(
            req_id=m.request_id, prompt_token_ids=list(m.prompt_token_ids), sampling_params=sp, seed=seed,
            eos_token_ids=self.engine.eos_token_ids, pooling_params=pp, prefix_cacheable=prefix_cacheable(sp, pp),
            speculative=speculative(sp), structured_output=grammar,
        )

    def _abort(self, rid: str) -> None:
        if rid in self.running:
            self.engine.abort_request(rid)
            self.flush = True
            self._end(rid, "abort")

    def _end(self, rid: str, reason: str) -> None:
        """Finish a running request the engine did not report finished; its output says why."""
        r = self.running.pop(rid)
        if reason != "abort":
            self.engine.abort_request(rid)
        self.pending.append(self._output(r, reason))

    def _end_all(self, reason: str) -> None:
        for rid in list(self.running):
            self._end(rid, reason)

    # ---- output ---------------------------------------------------------------------
    def _output(self, r: _Running, finish_reason: str | None = None) -> Any:
        req = r.req
        new = req.output_token_ids[r.sent_tokens:]
        lps = None if req.logprobs is None else req.logprobs[r.sent_tokens:r.sent_tokens + len(new)]
        r.sent_tokens += len(new)
        pooled = None
        if finish_reason is not None and req.pooled is not None:
            pooled = M.tensor_to_wire(req.pooled)
        return M.EngineCoreOutput(req.req_id, new, lps, finish_reason,
                                  req.stop_reason if finish_reason is not None else None, None, pooled)

    def _outputs(self, finished: list[Request]) -> list[Any]:
        done = {r.req_id for r in finished}
        outs = []
        for rid, r in list(self.running.items()):
            if rid in done:
                del self.running[rid]
                outs.append(self._output(r, r.req.finish_reason or "stop"))
            elif len(r.req.output_token_ids) > r.sent_tokens:
                outs.append(self._output(r))
        return outs

    def _send(self, outputs: list[Any]) -> None:
        outputs, self.pending = self.pending + outputs, []
        sch = self.engine.scheduler
        total = self.engine.num_blocks  # 0: a model without paged layers uses no KV cache
        prefix = (sch.prefix_cache_queries, sch.prefix_cache_hits)
        spec = (sch.spec_num_drafts, sch.spec_num_draft_tokens, sch.spec_num_accepted_tokens)
        msg = M.EngineCoreOutputs(
            outputs, len(sch.running), len(sch.waiting), 1.0 - sch.pool.num_free / total if total else 0.0,
            *(a - b for a, b in zip(prefix, self._prefix)), *(a - b for a, b in zip(spec, self._spec)))
        self._prefix, self._spec = prefix, spec
        self.out.send(M.encode(msg))
