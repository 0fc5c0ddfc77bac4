"""The OpenAI-compatible server: /v1/models, /v1/completions, /v1/chat/completions,
/v1/embeddings, /pooling, /classify, /score + /v1/score, /rerank + /v1/rerank (pooling_routes.py),
/health, /metrics.

Every request is served by one AsyncLLM (one engine thread, ``create_app``) or, with the
engine core in its own process, one AsyncMPClient (``create_mp_app``, what ``core-runner
serve`` uses by default); handlers run on uvicorn's event loop (``handlers.py``). Any
error is answered with OpenAI's error body on a connection that stays open, and the server
keeps serving. A client that goes away aborts its requests, whether they run, wait for a
row or are still being started (``streams.py``). Who may call what is ``access.py``; SIGTERM is ``shutdown.py``.
"""
from __future__ import annotations

import functools
import logging
import os
from contextlib import asynccontextmanager
from typing import Any, Awaitable, Callable, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from core_runner.engine.async_llm import AsyncLLM
from core_runner.engine.llm_engine import LLMEngine
from core_runner.entrypoints.openai.access import Gate
from core_runner.entrypoints.openai.handlers import Handlers
from core_runner.entrypoints.openai.metrics import PrometheusStats
from core_runner.entrypoints.openai.pooling_routes import PoolingRoutes
from core_runner.entrypoints.openai.protocol import APIError
from core_runner.entrypoints.openai.streams import ClientGone
from core_runner.entrypoints.openai.tools import ChatOptions
from core_runner.executor.gc_heap import freeze_gc_heap

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0


def default_served_name(model: str) -> str:
    """A local checkpoint is served (and labelled in /metrics) by its directory's name,
    not its path; a hub id as itself."""
    return os.path.basename(os.path.normpath(model)) if os.path.isdir(model) else model


def create_app(
    engine: LLMEngine, *, served_model_name: str | None = None, api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, request_timeout: float | None = None,
    disable_fastapi_docs: bool = False, protect_metrics: bool = False, chat_options: ChatOptions | None = None,
) -> FastAPI:
    """The app over ``engine``, run in this process by one AsyncLLM (one engine thread);
    the AsyncLLM is ``app.state.llm`` and is closed when the app shuts down.
    ``served_model_name`` defaults to ``default_served_name``; with ``api_key``, /v1 and the
    API docs need it, /metrics too if ``protect_metrics``; ``disable_fastapi_docs`` removes
    /docs, /redoc and /openapi.json; ``chat_options``: the tool call and reasoning parsers of
    /v1/chat/completions (``tools.ChatOptions``). ``create_mp_app`` is the same app over an
    engine core in its own process."""
    name = served_model_name or default_served_name(engine.config.model)
    stats = PrometheusStats(name)
    llm = AsyncLLM(engine, stats=stats, request_timeout=request_timeout)
    return _app(llm, name, stats, api_key=api_key, max_body_bytes=max_body_bytes,
                disable_fastapi_docs=disable_fastapi_docs, protect_metrics=protect_metrics, chat_options=chat_options)


def create_mp_app(
    model: str, engine_options: dict[str, Any] | None = None, *, served_model_name: str | None = None,
    request_timeout: float | None = None, ready_timeout: float | None = None, logits_processors: Sequence[str] = (),
    **app_options: Any,
) -> FastAPI:
    """``create_app``'s app with the engine core in its own process (docs/engine_core_process.md):
    the core is spawned and built from ``LLM(model, **engine_options)`` (the CLI's options), and
    this returns once it is ready; a core that cannot start raises its own error here. The
    app's ``app.state.llm`` is the ``AsyncMPClient``; ``logits_processors`` ("module:Class"
    names) are built in the core with those installed by entry point; ``app_options`` as
    ``create_app``'s."""
    from core_runner.engine.mp_client import READY_TIMEOUT_S, AsyncMPClient

    name = served_model_name or default_served_name(str(model))
    stats = PrometheusStats(name)
    llm = AsyncMPClient(model, engine_options, stats=stats, request_timeout=request_timeout,
                        logits_processors=logits_processors,
                        ready_timeout=READY_TIMEOUT_S if ready_timeout is None else ready_timeout)
    try:
        return _app(llm, name, stats, **app_options)
    except BaseException:
        llm.close()
        raise


def _app(llm: Any, name: str, stats: PrometheusStats, *, api_key: str | None = None,
         max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, disable_fastapi_docs: bool = False,
         protect_metrics: bool = False, chat_options: ChatOptions | None = None) -> FastAPI:
    """The routes over ``llm``: an AsyncLLM or an AsyncMPClient (the same interface)."""
    engine = llm.engine

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        llm.close(app.state.close_timeout)

    docs: dict[str, Any] = dict(docs_url=None, redoc_url=None, openapi_url=None) if disable_fastapi_docs else {}
    app = FastAPI(title="core-runner", lifespan=lifespan, **docs)
    app.state.llm, app.state.stats, app.state.model_name = llm, stats, name
    app.state.draining = False  # set by the shutdown (shutdown.GracefulServer)
    app.state.close_timeout = 10.0  # seconds the shutdown waits for the engine thread
    app.add_middleware(Gate, api_key=api_key, protect_metrics=protect_metrics, draining=lambda: app.state.draining)
    h = Handlers(llm, name, max_body_bytes, chat_options)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        err = APIError(f"{e.detail}: {request.method} {request.url.path}", None, e.status_code,
                       type="invalid_request_error" if e.status_code < 500 else "internal_server_error")
        return JSONResponse(err.body(), status_code=e.status_code)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, e: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: the connection is closed

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:  # the last resort: routes are _guarded
        logger.exception("internal error serving %s", request.url.path)
        return JSONResponse(_internal_error(e).body(), status_code=500)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if llm.is_running and not app.state.draining else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(stats.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{
            "id": name, "object": "model", "created": h.created, "owned_by": "core-runner",
            "root": engine.config.model, "max_model_len": engine.config.max_model_len}]})

    app.post("/v1/completions")(_guarded(h.completions))
    app.post("/v1/chat/completions")(_guarded(h.chat))
    app.post("/v1/embeddings")(_guarded(h.embeddings))
    pr = PoolingRoutes(h)
    app.post("/classify")(_guarded(pr.classify))
    app.post("/pooling")(_guarded(pr.pooling))
    for path in ("/score", "/v1/score"):
        app.post(path)(_guarded(pr.score))
    for path in ("/rerank", "/v1/rerank"):
        app.post(path)(_guarded(pr.rerank))
    return app


def _guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` answering an unexpected error with a 500 itself: Starlette's last-resort
    handler re-raises after answering, and uvicorn then closes the client's connection."""
    @functools.wraps(handler)
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except (APIError, ClientGone):
            raise  # their handlers answer
        except Exception as e:
            logger.exception("internal error serving %s", request.url.path)
            return JSONResponse(_internal_error(e).body(), status_code=500)

    return run


def _internal_error(e: Exception) -> APIError:
    return APIError(f"internal error: {type(e).__name__}: {e}", None, 500, type="internal_server_error")


def serve(engine: LLMEngine, *, host: str = "127.0.0.1", port: int = 8000,
          shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S, **app_options: Any) -> None:
    """Serve ``create_app(engine, **app_options)`` with uvicorn until SIGTERM / SIGINT
    (``shutdown.GracefulServer``: ``shutdown_timeout`` seconds of grace)."""
    _run(create_app(engine, **app_options), host, port, shutdown_timeout)


def serve_mp(model: str, engine_options: dict[str, Any] | None = None, *, host: str = "127.0.0.1",
             port: int = 8000, shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S, **app_options: Any) -> None:
    """``serve`` with the engine core in its own process (``create_mp_app``)."""
    if not shutdown_timeout >= 0:  # before the core starts
        raise ValueError(f"shutdown_timeout={shutdown_timeout!r} is invalid: expected seconds >= 0")
    _run(create_mp_app(model, engine_options, **app_options), host, port, shutdown_timeout)


def _run(app: FastAPI, host: str, port: int, shutdown_timeout: float) -> None:
    from core_runner.entrypoints.openai.shutdown import GracefulServer

    try:
        server = GracefulServer(app, shutdown_timeout, host=host, port=port, log_level="info")
    except BaseException:
        app.state.llm.close()
        raise
    freeze_gc_heap()  # the server process keeps its start-up heap (and an in-process engine) for good
    server.run()
    app.state.llm.close()  # a no-op after the app's own shutdown; a core left by a failed start-up is stopped
