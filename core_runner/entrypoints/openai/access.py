"""Who may call what, and when: the one ASGI middleware in front of the routes.

With an API key, ``/v1/*`` and the API description (``/docs``, ``/redoc``,
``/openapi.json``: it lists every route and field) need ``Authorization: Bearer KEY``;
``/health`` stays open (load balancers probe it), and so does ``/metrics`` (as in vLLM,
for Prometheus scrapers) unless ``protect_metrics``. The key is compared in constant time.
While the server drains for shutdown, new ``/v1/*`` requests get a 503.
"""
from __future__ import annotations

import hmac
from typing import Any, Callable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from core_runner.entrypoints.openai.protocol import APIError

DOC_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")


def key_matches(authorization: bytes, api_key: str) -> bool:
    """Whether an Authorization header value is ``Bearer <api_key>`` (constant time)."""
    return hmac.compare_digest(authorization, b"Bearer " + api_key.encode("utf-8"))


class Gate:
    """ASGI middleware: the API key, and 503s while draining (``draining()`` is true)."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, protect_metrics: bool,
                 draining: Callable[[], bool]) -> None:
        self.app, self.api_key, self.draining = app, api_key, draining
        self.keyed = DOC_PATHS + (("/metrics",) if protect_metrics else ())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        api = path.startswith("/v1/") or path == "/v1"
        if self.api_key is not None and (api or path in self.keyed):
            auth = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not key_matches(auth, self.api_key):
                what = "no API key was given" if not auth else "the API key is wrong"
                await _answer(APIError(f"{what}: send the header 'Authorization: Bearer <key>' with the server's "
                                       "--api-key", None, 401, code="invalid_api_key"), scope, receive, send)
                return
        if api and self.draining():
            await _answer(APIError("the server is shutting down and takes no new requests; retry on another "
                                   "replica", None, 503, type="service_unavailable"), scope, receive, send,
                          {"connection": "close"})
            return
        await self.app(scope, receive, send)


async def _answer(err: APIError, scope: Scope, receive: Receive, send: Send,
                  headers: dict[str, Any] | None = None) -> None:
    await JSONResponse(err.body(), status_code=err.status, headers=headers)(scope, receive, send)
