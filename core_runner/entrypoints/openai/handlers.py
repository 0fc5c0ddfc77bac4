"""The route handlers of /v1/completions, /v1/chat/completions and /v1/embeddings.

Each handler reads its body (``request_body``), turns it into engine parameters
(``protocol``), starts its engine requests (``streams.start_all``: all of them, without
waiting for a first token, watching the client meanwhile) and answers with JSON or
server-sent events. A stream that fails after its headers went out ends with an OpenAI
error event instead of a broken connection.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
import uuid
from typing import Any, AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from core_runner.engine.async_llm import AsyncLLM, Delta
from core_runner.engine.mp_client import AsyncMPClient
from core_runner.engine.request_stream import RequestStream
from core_runner.entrypoints.openai import protocol as P
from core_runner.entrypoints.openai.fields import check_fields
from core_runner.entrypoints.openai.protocol import APIError
from core_runner.entrypoints.openai.request_body import read_json
from core_runner.entrypoints.openai.streams import StartError, collect_while_connected, merge, sse, start_all
from core_runner.entrypoints.openai.structured_body import structured_outputs_of
from core_runner.entrypoints.openai.tools import ChatOptions, template_messages

logger = logging.getLogger(__name__)


class Handlers:
    def __init__(self, llm: AsyncLLM | AsyncMPClient, name: str, max_body_bytes: int,
                 chat_options: ChatOptions | None = None) -> None:
        self.llm, self.engine, self.name = llm, llm.engine, name
        self.chat_options = chat_options or ChatOptions()
        self.max_body = max_body_bytes
        self.created = int(time.time())

    # ---- request plumbing -----------------------------------------------------------
    async def body(self, request: Request) -> dict:
        body = await read_json(request, self.max_body)
        model = body.get("model")
        if model is not None and model not in (self.name, self.engine.config.model):
            raise APIError(f"the model {P._short(model)} does not exist; this server serves {self.name!r}", "model",
                           404, code="model_not_found")
        check_fields(request.url.path, body)
        return body

    def require(self, task: str) -> None:
        if task not in self.engine.tasks:
            raise APIError(f"the model {self.name!r} does not support this endpoint: its tasks are "
                           f"{list(self.engine.tasks)}, this endpoint needs {task!r}", "model")

    async def _start(self, request: Request, body: dict, n: int, start_one: Callable[[int], RequestStream],
                     prompt_param: str, index_of: Callable[[int], int | None]) -> list[RequestStream]:
        """``start_all``, with an engine refusal as a 400 naming the field at fault and a
        server past its shutdown grace as a 503."""
        try:
            return await start_all(self.llm, request, n, start_one)
        except StartError as e:
            raise P.engine_error(str(e.error), body, prompt_param, index_of(e.index)) from None
        except RuntimeError as e:  # shut down (AsyncLLM.abort_all) or the engine thread is gone
            raise APIError(str(e), None, 503, type="service_unavailable") from None

    async def collect(self, request: Request, streams: list[RequestStream], param: str | None) -> list[Delta]:
        """``collect_while_connected``, with a request the engine refused once queued (the
        engine core resolves pooling defaults when a request arrives) as a 400 naming
        ``param``, and an engine that went away meanwhile as a 503."""
        try:
            return await collect_while_connected(request, streams)
        except ValueError as e:
            raise APIError(str(e), param) from None
        except RuntimeError as e:
            raise APIError(str(e), None, 503, type="service_unavailable") from None

    async def _start_choices(self, request: Request, body: dict, prompts: list, params,
                             prompt_param: str) -> list[RequestStream]:
        """``params.n`` streams per prompt, choice ``i * n + j`` being sample j of prompt i,
        seeded ``seed + j`` when seeded (as ``LLM.generate`` fans out n)."""
        rid, n = uuid.uuid4().hex, params.n
        ones = [dataclasses.replace(params, n=1, seed=None if params.seed is None else (params.seed + j) % 2**63)
                for j in range(n)]

        def start_one(k: int) -> RequestStream:
            i, j = divmod(k, n)
            return self.llm.start(prompts[i], ones[j], f"{rid}-{i}-{j}")

        return await self._start(request, body, len(prompts) * n, start_one, prompt_param,
                                 lambda k: k // n if len(prompts) > 1 else None)

    async def _constrain(self, body: dict, params):
        """The body's structured-output constraint on ``params``; its grammar is compiled (in the
        engine's compile pool, cached) before the request is queued, so a schema xgrammar refuses
        is a 400 naming the field, and the engine thread never waits for a compile."""
        so = structured_outputs_of(body)
        if so is None:
            return params
        params = dataclasses.replace(params, structured_outputs=so)
        await self._compile(so, "response_format" if "response_format" in body else "structured_outputs")
        return params

    async def _compile(self, so, param: str) -> None:
        try:
            g = self.engine.input_processor.structured_outputs().request(so, ())
            await asyncio.wrap_future(g.future)
        except ValueError as e:
            raise APIError(str(e), param) from None

    # ---- /v1/completions ------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        body = await self.body(request)
        self.require("generate")
        P.check_unsupported(body, ("best_of", "echo", "suffix"))
        prompts = P.completion_prompts(body)
        stream, usage = P.stream_options(body)
        params, _ = P.sampling_params(body, self.engine.default_sampling_params(), chat=False)
        params = await self._constrain(body, params)
        gens = await self._start_choices(request, body, prompts, params, "prompt")
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": self.name}
        if stream:
            async def events() -> AsyncIterator[str]:
                counts: dict[int, tuple[int, int]] = {}
                async for i, d in merge(gens):
                    counts[i] = (d.num_prompt_tokens if i % params.n == 0 else 0, d.num_output_tokens)
                    # a step's tokens make a chunk even when their text is empty (a character still
                    # incomplete, or no tokenizer): the client sees the first token when it is made
                    if d.text or d.token_ids or d.finished or d.logprobs:
                        choice = {"index": i, "text": d.text, "logprobs": self._completion_logprobs(d),
                                  "finish_reason": d.finish_reason, "stop_reason": d.stop_reason}
                        yield sse({**head, "choices": [choice]})
                if usage:
                    yield sse({**head, "choices": [], "usage": _usage(counts.values())})
            return _stream(events())
        finals = await self.collect(request, gens, "prompt")
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
        plan = self.chat_options.plan(body)  # tools, tool_choice, reasoning: tools.py
        msgs = P.chat_messages(body)
        stream, usage = P.stream_options(body)
        params, given = P.sampling_params(body, self.engine.default_sampling_params(), chat=True)
        params = await self._constrain(body, params)
        params = plan.sampling(params)
        if plan.constraint is not None:  # a tool schema xgrammar refuses is a 400 too
            await self._compile(plan.constraint, "tools")
        ids = self._render_chat(template_messages(msgs), plan.tools)
        if not given:  # the rest of the context, as vLLM does
            room = self.engine.config.max_model_len - len(ids)
            if room < 1:
                raise APIError(f"the chat prompt is {len(ids)} tokens, which fills the model's "
                               f"max_model_len={self.engine.config.max_model_len}", "messages")
            params.max_tokens = room
        top = body.get("top_logprobs") or 0
        gens = await self._start_choices(request, body, [ids], params, "messages")
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "object": "chat.completion", "created": created, "model": self.name}
        if stream:
            head["object"] = "chat.completion.chunk"

            async def events() -> AsyncIterator[str]:
                first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}
                for j in range(len(gens)):
                    yield sse({**head, "choices": [{**first, "index": j}]})
                counts: dict[int, tuple[int, int]] = {}
                outs = [plan.choice() for _ in gens]
                async for j, d in merge(gens):
                    counts[j] = (d.num_prompt_tokens if j == 0 else 0, d.num_output_tokens)
                    deltas = outs[j].feed(d.text) if d.text else []
                    if d.finished:
                        deltas += outs[j].finish()
                    for delta in deltas[:-1]:  # all but the last: no logprobs, no finish
                        yield sse({**head, "choices": [{"index": j, "delta": delta, "logprobs": None,
                                                        "finish_reason": None}]})
                    if deltas or d.finished or d.logprobs:
                        reason = outs[j].finish_reason(d.finish_reason)
                        choice = {"index": j, "delta": deltas[-1] if deltas else {},
                                  "logprobs": self._chat_logprobs(d, top), "finish_reason": reason,
                                  "stop_reason": d.stop_reason}
                        yield sse({**head, "choices": [choice]})
                if usage and counts:
                    yield sse({**head, "choices": [], "usage": _usage(counts.values())})
            return _stream(events())
        finals = await self.collect(request, gens, "messages")
        messages = [plan.choice().message(d.text, d.finish_reason) for d in finals]
        choices = [{"index": j, "message": msg, "logprobs": self._chat_logprobs(d, top), "finish_reason": reason,
                    "stop_reason": d.stop_reason} for j, (d, (msg, reason)) in enumerate(zip(finals, messages))]
        return JSONResponse({**head, "choices": choices, "usage": _usage(
            (d.num_prompt_tokens if j == 0 else 0, d.num_output_tokens) for j, d in enumerate(finals))})

    def _render_chat(self, msgs: list[dict], tools: list[dict] | None = None) -> list[int]:
        tok = self.engine.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise APIError(f"the model {self.name!r} has no chat template (its tokenizer_config.json sets no "
                           "chat_template): use /v1/completions with a prompt", "messages")
        try:
            text = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
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
        fmt = P.encoding_format(body)
        rid = uuid.uuid4().hex
        streams = await self._start(
            request, body, len(inputs),
            lambda i: self.llm.start(inputs[i], None, f"emb-{rid}-{i}", pooling_params=params),
            "input", lambda i: i if len(inputs) > 1 else None)
        outs = await self.collect(request, streams, "input")
        failed = next(((i, d.finish_reason) for i, d in enumerate(outs) if d.embedding is None), None)
        if failed is not None:  # aborted (--request-timeout, shutdown) or failed in the engine
            i, why = failed
            if why == "abort":
                raise APIError(f"input[{i}] was aborted before it was embedded (the request timed out or the "
                               "server is shutting down)", None, 503, type="service_unavailable")
            raise APIError(f"input[{i}] was not embedded: the engine step failed (finish_reason={why!r}; see the "
                           "server log)", None, 500, type="internal_server_error")
        data = [{"object": "embedding", "index": i, "embedding": _encode(d.embedding, fmt)}
                for i, d in enumerate(outs)]
        n = sum(d.num_prompt_tokens for d in outs)
        return JSONResponse({"object": "list", "data": data, "model": self.name,
                             "usage": {"prompt_tokens": n, "total_tokens": n}})


def _encode(vector: Any, fmt: str) -> list[float] | str:
    """An embedding (a CPU float32 tensor) as OpenAI's "float" list or "base64" string
    (the little-endian float32 bytes)."""
    if fmt == "float":
        return vector.tolist()
    return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")


def _usage(counts) -> dict[str, int]:
    counts = list(counts)
    p, c = sum(x[0] for x in counts), sum(x[1] for x in counts)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _stream(events: AsyncIterator[str]) -> StreamingResponse:
    """Server-sent events ending with ``[DONE]``; an error after the headers went out
    ends the stream with an OpenAI error event (the status line can no longer say it)."""
    async def guarded() -> AsyncIterator[str]:
        try:
            async for e in events:
                yield e
        except Exception as e:
            logger.exception("a streamed response failed")
            if isinstance(e, APIError):
                err = e
            elif isinstance(e, ValueError):  # the engine refused the request once queued
                err = APIError(str(e), None)
            else:  # the engine went away too (its core process died): the message says so
                err = APIError(f"internal error: {type(e).__name__}: {e}", None, 500, type="internal_server_error")
            yield sse(err.body())
        yield "data: [DONE]\n\n"

    return StreamingResponse(guarded(), media_type="text/event-stream")
