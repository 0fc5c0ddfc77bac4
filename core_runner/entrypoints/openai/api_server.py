"""The OpenAI-compatible server: /v1/models, /v1/completions, /v1/chat/completions,
/v1/embeddings, /health, /metrics.

Every request is served by one AsyncLLM (one engine thread); handlers run on uvicorn's
event loop. Any error is answered with OpenAI's error body and the server keeps serving.
A streamed response whose client goes away is cancelled by Starlette, which closes the
AsyncLLM iterators and so aborts the requests.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from core_runner.engine.async_llm import AsyncLLM, Delta
from core_runner.engine.llm_engine import LLMEngine
from core_runner.entrypoints.openai import protocol as P
from core_runner.entrypoints.openai.metrics import PrometheusStats
from core_runner.entrypoints.openai.protocol import APIError

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 1 << 20


def create_app(
    engine: LLMEngine, *, served_model_name: str | None = None, api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, request_timeout: float | None = None,
) -> FastAPI:
    """The app over ``engine``; its AsyncLLM is ``app.state.llm`` and is closed when the
    app shuts down. ``served_model_name`` defaults to the model path."""
    name = served_model_name or engine.config.model
    stats = PrometheusStats(name)
    llm = AsyncLLM(engine, stats=stats, request_timeout=request_timeout)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        llm.close()

    app = FastAPI(title="core-runner", lifespan=lifespan)
    app.state.llm, app.state.stats, app.state.model_name = llm, stats, name
    h = _Handlers(llm, name, api_key, max_body_bytes)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        err = APIError(f"{e.detail}: {request.method} {request.url.path}", None, e.status_code,
                       type="invalid_request_error" if e.status_code < 500 else "internal_server_error")
        return JSONResponse(err.body(), status_code=e.status_code)

    @app.exception_handler(_ClientGone)
    async def _gone(request: Request, e: _ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: the connection is closed

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        logger.exception("internal error serving %s", request.url.path)
        err = APIError(f"internal error: {type(e).__name__}: {e}", None, 500, type="internal_server_error")
        return JSONResponse(err.body(), status_code=500)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if llm.is_running else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(stats.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        h.authorize(request)
        return JSONResponse({"object": "list", "data": [{
            "id": name, "object": "model", "created": h.created, "owned_by": "core-runner",
            "root": engine.config.model, "max_model_len": engine.config.max_model_len}]})

    app.post("/v1/completions")(h.completions)
    app.post("/v1/chat/completions")(h.chat)
    app.post("/v1/embeddings")(h.embeddings)
    return app


class _Handlers:
    def __init__(self, llm: AsyncLLM, name: str, api_key: str | None, max_body_bytes: int) -> None:
        self.llm, self.engine, self.name = llm, llm.engine, name
        self.api_key, self.max_body = api_key, max_body_bytes
        self.created = int(time.time())

    # ---- request plumbing -----------------------------------------------------------
    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        if auth != f"Bearer {self.api_key}":
            what = "no API key was given" if not auth else "the API key is wrong"
            raise APIError(f"{what}: send the header 'Authorization: Bearer <key>' with the server's --api-key",
                           None, 401, code="invalid_api_key")

    async def body(self, request: Request) -> dict:
        self.authorize(request)
        too_big = APIError(f"the request body is larger than the server's limit of {self.max_body} bytes",
                           None, 413, code="request_too_large")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise too_big
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > self.max_body:
                raise too_big
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise APIError(f"the request body must be a JSON object, got {type(body).__name__}")
        model = body.get("model")
        if model is not None and model not in (self.name, self.engine.config.model):
            raise APIError(f"the model {model!r} does not exist; this server serves {self.name!r}", "model", 404,
                           code="model_not_found")
        return body

    def require(self, task: str) -> None:
        if task not in self.engine.tasks:
            raise APIError(f"the model {self.name!r} does not support this endpoint: its tasks are "
                           f"{list(self.engine.tasks)}, this endpoint needs {task!r}", "model")

    async def _start(self, prompts: list, params, param: str) -> list[AsyncIterator[Delta]]:
        """One iterator per choice, each already past its first delta (so input errors are a
        400): ``params.n`` per prompt, choice ``i * n + j`` being sample j of prompt i, seeded
        ``seed + j`` when seeded (as ``LLM.generate`` fans out n)."""
        rid = uuid.uuid4().hex
        started = []
        n = params.n
        try:
            for i, p in enumerate(prompts):
                for j in range(n):
                    seed = None if params.seed is None else (params.seed + j) % 2**63
                    one = dataclasses.replace(params, n=1, seed=seed)
                    started.append(_Primed(self.llm.generate(p, one, f"{rid}-{i}-{j}")))
                    await started[-1].prime()
        except ValueError as e:
            for s in started:
                await s.aclose()
            where = f"{param}[{i}]: " if len(prompts) > 1 else ""
            raise APIError(f"{where}{e}", param) from None
        except BaseException:
            for s in started:
                await s.aclose()
            raise
        return started

    # ---- /v1/completions ------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        body = await self.body(request)
        self.require("generate")
        P.check_unsupported(body, ("best_of", "echo", "suffix"))
        prompts = P.completion_prompts(body)
        stream, usage = P.stream_options(body)
        params, _ = P.sampling_params(body, self.engine.default_sampling_params(), chat=False)
        gens = await self._start(prompts, params, "prompt")
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": self.name}
        if stream:
            async def events() -> AsyncIterator[str]:
                counts: dict[int, tuple[int, int]] = {}
                async for i, d in _merge(gens):
                    counts[i] = (d.num_prompt_tokens if i % params.n == 0 else 0, d.num_output_tokens)
                    if d.text or d.finished or d.logprobs:
                        choice = {"index": i, "text": d.text, "logprobs": self._completion_logprobs(d),
                                  "finish_reason": d.finish_reason, "stop_reason": d.stop_reason}
                        yield _sse({**head, "choices": [choice]})
                if usage:
                    yield _sse({**head, "choices": [], "usage": _usage(counts.values())})
                yield "data: [DONE]\n\n"
            return _stream(events())
        finals = await _collect_while_connected(request, gens)
        choices = [{"index": i, "text": d.text, "logprobs": self._completion_logprobs(d),
                    "finish_reason": d.finish_reason, "stop_reason": d.stop_reason} for i, d in enumerate(finals)]
        return JSONResponse({**head, "choices": choices, "usage": _usage(
            (d.num_prompt_tokens if i % params.n == 0 else 0, d.num_output_tokens) for i, d in enumerate(finals))})

    def _completion_logprobs(self, d: Delta) -> dict | None:
        if d.logprobs is None:
            return None
        dec = self._token_text
        return {"tokens": [dec(t) for t in d.token_ids],
                "token_logprobs": [lp.get(t) for t, lp in zip(d.token_ids, d.logprobs)],
                "top_logprobs": [{dec(k): v for k, v in lp.items()} for lp in d.logprobs],
                "text_offset": None}

    def _token_text(self, token: int) -> str:
        tok = self.engine.tokenizer
        return tok.decode([token]) if tok is not None else str(token)

    # ---- /v1/chat/completions -------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        body = await self.body(request)
        self.require("generate")
        P.check_unsupported(body, ("tools", "tool_choice", "response_format"))
        msgs = P.chat_messages(body)
        stream, usage = P.stream_options(body)
        params, given = P.sampling_params(body, self.engine.default_sampling_params(), chat=True)
        ids = self._render_chat(msgs)
        if not given:  # the rest of the context, as vLLM does
            room = self.engine.config.max_model_len - len(ids)
            if room < 1:
                raise APIError(f"the chat prompt is {len(ids)} tokens, which fills the model's "
                               f"max_model_len={self.engine.config.max_model_len}", "messages")
            params.max_tokens = room
        top = body.get("top_logprobs") or 0
        gens = await self._start([ids], params, "messages")
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "object": "chat.completion", "created": created, "model": self.name}
        if stream:
            head["object"] = "chat.completion.chunk"

            async def events() -> AsyncIterator[str]:
                first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}
                yield _sse({**head, "choices": [first]})
                counts: dict[int, tuple[int, int]] = {}
                for j in range(1, len(gens)):
                    yield _sse({**head, "choices": [{**first, "index": j}]})
                async for j, d in _merge(gens):
                    counts[j] = (d.num_prompt_tokens if j == 0 else 0, d.num_output_tokens)
                    if d.text or d.finished or d.logprobs:
                        choice = {"index": j, "delta": {"content": d.text} if d.text else {},
                                  "logprobs": self._chat_logprobs(d, top), "finish_reason": d.finish_reason,
                                  "stop_reason": d.stop_reason}
                        yield _sse({**head, "choices": [choice]})
                if usage and counts:
                    yield _sse({**head, "choices": [], "usage": _usage(counts.values())})
                yield "data: [DONE]\n\n"
            return _stream(events())
        finals = await _collect_while_connected(request, gens)
        choices = [{"index": j, "message": {"role": "assistant", "content": d.text},
                    "logprobs": self._chat_logprobs(d, top), "finish_reason": d.finish_reason,
                    "stop_reason": d.stop_reason} for j, d in enumerate(finals)]
        return JSONResponse({**head, "choices": choices, "usage": _usage(
            (d.num_prompt_tokens if j == 0 else 0, d.num_output_tokens) for j, d in enumerate(finals))})

    def _render_chat(self, msgs: list[dict]) -> list[int]:
        tok = self.engine.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise APIError(f"the model {self.name!r} has no chat template (its tokenizer_config.json sets no "
                           "chat_template): use /v1/completions with a prompt", "messages")
        try:
            text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        except Exception as e:  # a template error is the messages' fault (e.g. roles out of order)
            raise APIError(f"the chat template failed on these messages: {e}", "messages") from None
        return list(tok.encode(text, add_special_tokens=False))

    def _chat_logprobs(self, d: Delta, top: int) -> dict | None:
        if d.logprobs is None:
            return None
        content = []
        for t, lp in zip(d.token_ids, d.logprobs):
            s = self._token_text(t)
            best = sorted(lp.items(), key=lambda kv: -kv[1])[:top]
            content.append({"token": s, "logprob": lp.get(t), "bytes": list(s.encode()),
                            "top_logprobs": [{"token": self._token_text(k), "logprob": v,
                                              "bytes": list(self._token_text(k).encode())} for k, v in best]})
        return {"content": content}

    # ---- /v1/embeddings -------------------------------------------------------------
    async def embeddings(self, request: Request) -> Response:
        body = await self.body(request)
        self.require("embed")
        inputs = P.embedding_inputs(body)
        params = P.pooling_params(body)
        rid = uuid.uuid4().hex
        try:
            outs = await asyncio.gather(*(self.llm.embed(x, params, f"emb-{rid}-{i}") for i, x in enumerate(inputs)))
        except ValueError as e:
            raise APIError(str(e), "input") from None
        data = [{"object": "embedding", "index": i, "embedding": d.embedding.tolist()} for i, d in enumerate(outs)]
        n = sum(d.num_prompt_tokens for d in outs)
        return JSONResponse({"object": "list", "data": data, "model": self.name,
                             "usage": {"prompt_tokens": n, "total_tokens": n}})


# how often a non-streamed request checks that its client is still connected
_DISCONNECT_POLL_S = 0.1


class _Primed:
    """An AsyncLLM iterator whose first delta has been read (and is yielded first)."""

    def __init__(self, gen: AsyncIterator[Delta]) -> None:
        self.gen, self.first = gen, None

    async def prime(self) -> None:
        self.first = await self.gen.__anext__()

    async def aclose(self) -> None:
        await self.gen.aclose()

    async def __aiter__(self) -> AsyncIterator[Delta]:
        yield self.first
        if not self.first.finished:
            async for d in self.gen:
                yield d


async def _merge(gens: list[_Primed]) -> AsyncIterator[tuple[int, Delta]]:
    """(index, delta) from several iterators as they come; closing this closes them all
    (so their requests are aborted)."""
    if len(gens) == 1:
        try:
            async for d in gens[0]:
                yield 0, d
        finally:
            await gens[0].aclose()
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, g: _Primed) -> None:
        try:
            async for d in g:
                await q.put((i, d))
        except BaseException as e:
            await q.put((i, e))
            raise
        finally:
            await g.aclose()

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        left = len(gens)
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


class _ClientGone(Exception):
    """The client of a non-streamed request disconnected before its answer was ready."""


async def _collect_while_connected(request: Request, gens: list[_Primed]) -> list[Delta]:
    """``_collect``, aborting the requests when the client disconnects meanwhile (a
    non-streamed request is otherwise never cancelled by the server)."""
    task = asyncio.ensure_future(_collect(gens))
    while True:
        done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()  # _merge closes every iterator: AsyncLLM aborts their requests
            await asyncio.gather(task, return_exceptions=True)
            raise _ClientGone()


async def _collect(gens: list[_Primed]) -> list[Delta]:
    """Each iterator's whole output as one Delta (text and tokens joined)."""
    out: list[Delta | None] = [None] * len(gens)
    async for i, d in _merge(gens):
        if out[i] is None:
            out[i] = d
            continue
        acc = out[i]
        acc.token_ids += d.token_ids
        acc.text += d.text
        if d.logprobs is not None:
            acc.logprobs = (acc.logprobs or []) + d.logprobs
        for f in ("finished", "finish_reason", "stop_reason", "num_output_tokens", "cumulative_logprob"):
            setattr(acc, f, getattr(d, f))
    return out


def _usage(counts) -> dict[str, int]:
    counts = list(counts)
    p, c = sum(x[0] for x in counts), sum(x[1] for x in counts)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream")


def serve(engine: LLMEngine, *, host: str = "127.0.0.1", port: int = 8000, **app_options: Any) -> None:
    """Serve ``create_app(engine, **app_options)`` with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(create_app(engine, **app_options), host=host, port=port, log_level="info")
