"""The route handlers of vLLM's pooling endpoints beyond embeddings: /classify,
/score and /v1/score, /rerank and /v1/rerank (the Jina / Cohere shape).

- ``/classify``: ``{"input": str | [str] | ids, "use_activation"?}`` -> ``data`` of
  ``{"index", "label", "probs", "num_classes"}`` (a classifier).
- ``/pooling``: ``{"input": str | [str] | ids, "task"?, "encoding_format"?}`` -> ``data`` of
  ``{"index", "object": "pooling", "data"}`` (vLLM's general pooling endpoint; ``task``
  one of the model's pooling tasks, default its first).
- ``/score``: ``{"text_1": str | [str], "text_2": str | [str]}`` (1:1, 1:N, N:N, as
  ``LLM.score``) -> ``data`` of ``{"index", "object": "score", "score"}``.
- ``/rerank``: ``{"query": str, "documents": [str], "top_n"?: int, "return_documents"?}``
  -> ``results`` of ``{"index", "document": {"text"}, "relevance_score"}``, best first,
  the first ``top_n`` (0 or absent: all).

Scores come from a cross-encoder (the pair through the tokenizer's pair template, token
types on) or from an embedding model (the cosine of the two embeddings), as offline.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

import torch
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from core_runner.engine import score as sc
from core_runner.entrypoints.openai import protocol as P
from core_runner.entrypoints.openai.handlers import _encode
from core_runner.entrypoints.openai.protocol import APIError
from core_runner.pooling_params import POOLING_TASKS, PoolingParams


class PoolingRoutes:
    """Handlers sharing ``Handlers``' plumbing (body, task check, start, disconnects)."""

    def __init__(self, h: Any) -> None:
        self.h, self.llm, self.engine, self.name = h, h.llm, h.engine, h.name

    # ---- /classify ------------------------------------------------------------------
    async def classify(self, request: Request) -> Response:
        body = await self.h.body(request)
        self.h.require("classify")
        inputs = P.embedding_inputs(body)
        params = _with(P.pooling_params(body), body, task="classify")
        outs = await self._run(request, body, [(x, params) for x in inputs], "input")
        labels = {int(k): str(v) for k, v in dict(getattr(self.engine.hf_config, "id2label", None) or {}).items()}
        data = [{"index": i, "label": labels.get(int(d.embedding.argmax())), "probs": d.embedding.tolist(),
                 "num_classes": int(d.embedding.numel())} for i, d in enumerate(outs)]
        return self._answer("classify", {"data": data}, outs)

    # ---- /pooling -------------------------------------------------------------------
    async def pooling(self, request: Request) -> Response:
        body = await self.h.body(request)
        tasks = [t for t in self.engine.tasks if t in POOLING_TASKS]
        task = body.get("task", tasks[0] if tasks else None)
        if task not in tasks:
            raise APIError(f"task={P._short(task)} is invalid for the model {self.name!r}: expected one of its "
                           f"pooling tasks {tasks}", "task")
        inputs = P.embedding_inputs(body)
        fmt = P.encoding_format(body)
        params = _with(P.pooling_params(body), body, task=task)
        outs = await self._run(request, body, [(x, params) for x in inputs], "input")
        data = [{"index": i, "object": "pooling", "data": _encode(d.embedding, fmt)} for i, d in enumerate(outs)]
        return self._answer("pool", {"data": data}, outs)

    # ---- /score, /v1/score ----------------------------------------------------------
    async def score(self, request: Request) -> Response:
        body = await self.h.body(request)
        for field in ("text_1", "text_2"):
            if field not in body:
                raise APIError(f"{field} is required (a string or a list of strings)", field)
        try:
            pairs = sc.pair_up(body["text_1"], body["text_2"])
        except ValueError as e:
            raise APIError(str(e).replace("data_", "text_"), "text_2") from None
        scores, outs = await self._scores(request, body, pairs)
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
        return self._answer("score", {"data": data}, outs)

    # ---- /rerank, /v1/rerank --------------------------------------------------------
    async def rerank(self, request: Request) -> Response:
        body = await self.h.body(request)
        query, docs, top_n = body.get("query"), body.get("documents"), body.get("top_n")
        if not isinstance(query, str):
            raise APIError(f"query must be a string, got {P._short(query)}", "query")
        if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
            raise APIError("documents must be a non-empty list of strings", "documents")
        if top_n is not None and (not P._is_int(top_n) or top_n < 0):
            raise APIError(f"top_n must be an integer >= 0 (0: every document), got {P._short(top_n)}", "top_n")
        scores, outs = await self._scores(request, body, [(query, d) for d in docs])
        order = sorted(range(len(docs)), key=lambda i: -scores[i])[: top_n or None]
        keep = body.get("return_documents", True) is not False
        results = [{"index": i, **({"document": {"text": docs[i]}} if keep else {}), "relevance_score": scores[i]}
                   for i in order]
        n = sum(d.num_prompt_tokens for d in outs)
        return JSONResponse({"id": f"rerank-{uuid.uuid4().hex}", "model": self.name, "results": results,
                             "usage": {"prompt_tokens": n, "total_tokens": n}})

    # ---- shared ---------------------------------------------------------------------
    async def _scores(self, request: Request, body: dict, pairs: list[tuple[str, str]]) -> tuple[list[float], list]:
        """One score per pair and the finished requests' deltas."""
        base = P.pooling_params(body)
        tasks = self.engine.tasks
        if "score" in tasks:
            base = _with(base, body, task="score")
            labels = int(getattr(self.engine.hf_config, "num_labels", 1) or 1)
            if labels != 1:
                raise APIError(f"the model {self.name!r} classifies into {labels} labels: scoring needs a "
                               "cross-encoder of one label (use /classify)", "model")
            if self.engine.tokenizer is None:
                raise APIError(f"the model {self.name!r} has no tokenizer for the pair template", "model")
            limit = base.truncate_prompt_tokens
            limit = self.engine.input_processor.pooling_prompt_limit() if limit == -1 else limit
            jobs = []
            for ids, start in sc.encode_pairs(self.engine.tokenizer, pairs, limit):
                jobs.append(({"prompt_token_ids": ids},
                             _replace(base, truncate_prompt_tokens=None, compressed_token_type_ids=start)))
            outs = await self._run(request, body, jobs, "text_2")
            return [float(d.embedding.reshape(-1)[0]) for d in outs], outs
        if "embed" in tasks:
            texts = list(dict.fromkeys(t for p in pairs for t in p))
            outs = await self._run(request, body, [(t, _replace(base, task="embed")) for t in texts], "text_2")
            vec = dict(zip(texts, (d.embedding.float() for d in outs)))
            return [float(torch.nn.functional.cosine_similarity(vec[a], vec[b], dim=0)) for a, b in pairs], outs
        raise APIError(f"the model {self.name!r} does not support this endpoint: its tasks are {list(tasks)}, "
                       "scoring needs 'score' (a cross-encoder) or 'embed'", "model")

    async def _run(self, request: Request, body: dict, jobs: list[tuple[Any, PoolingParams]], param: str) -> list:
        rid = uuid.uuid4().hex
        streams = await self.h._start(
            request, body, len(jobs),
            lambda i: self.llm.start(jobs[i][0], None, f"pool-{rid}-{i}", pooling_params=jobs[i][1]),
            param, lambda i: i if len(jobs) > 1 else None)
        outs = await self.h.collect(request, streams, param)
        for i, d in enumerate(outs):
            if d.embedding is None:
                if d.finish_reason == "abort":
                    raise APIError(f"request {i} was aborted (the request timed out or the server is shutting "
                                   "down)", None, 503, type="service_unavailable")
                raise APIError(f"request {i} failed in the engine (finish_reason={d.finish_reason!r}; see the "
                               "server log)", None, 500, type="internal_server_error")
        return outs

    def _answer(self, kind: str, payload: dict, outs: list) -> JSONResponse:
        n = sum(d.num_prompt_tokens for d in outs)
        return JSONResponse({"id": f"{kind}-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                             "model": self.name, **payload,
                             "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}})


def _with(params: PoolingParams, body: dict, **fields: Any) -> PoolingParams:
    """``params`` with the task and the body's ``use_activation`` (a 400 naming it if invalid)."""
    if "use_activation" in body:
        fields["use_activation"] = body["use_activation"]
    return _replace(params, **fields)


def _replace(params: PoolingParams, **fields: Any) -> PoolingParams:
    try:
        return dataclasses.replace(params, **fields)
    except ValueError as e:
        field = next((f for f in fields if f"PoolingParams.{f}=" in str(e)), None)
        raise APIError(str(e), field) from None
