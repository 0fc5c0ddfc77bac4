"""Shutdown on SIGTERM / SIGINT, as vLLM's ``--shutdown-timeout`` does it.

First signal: stop accepting (the listening socket closes, so new connections are
refused; a request already on an open connection gets a 503 and /health says 503), let
the requests in flight run for up to ``shutdown_timeout`` seconds, then abort the rest:
their streams end with finish_reason "abort", a non-streamed answer carries it, and the
process exits once their responses are out. 0 aborts at once. A second signal exits at
once, without waiting for anything.

uvicorn's own handling would wait for every open connection without a bound and takes
a second SIGTERM for nothing (only a second SIGINT forces), so ``GracefulServer``
replaces its signal handler. The handler runs between two bytecodes of the main thread,
which also runs the event loop: it only sets flags and hands the rest to the loop.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from types import FrameType

import uvicorn
from fastapi import FastAPI

logger = logging.getLogger(__name__)

# after a second signal, the process is ended this many seconds later whatever still runs
FORCED_EXIT_S = 2.0
# uvicorn cancels the handlers still running this long after the grace (a last resort:
# aborted requests end in well under a second)
_AFTER_GRACE_S = 5.0


class GracefulServer(uvicorn.Server):
    """uvicorn serving ``app`` (``create_app``'s) with the shutdown described above."""

    def __init__(self, app: FastAPI, shutdown_timeout: float, **config) -> None:
        if not shutdown_timeout >= 0:
            raise ValueError(f"shutdown_timeout={shutdown_timeout!r} is invalid: expected seconds >= 0 "
                             "(0 aborts the requests in flight at once)")
        config.setdefault("timeout_graceful_shutdown", shutdown_timeout + _AFTER_GRACE_S)
        super().__init__(uvicorn.Config(app, **config))
        self.fastapi_app, self.shutdown_timeout = app, shutdown_timeout
        self.signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._grace: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)
        if self.force_exit and self.started:  # uvicorn skipped the app's shutdown: run it, briefly
            self.fastapi_app.state.close_timeout = FORCED_EXIT_S / 4
            try:
                await asyncio.wait_for(self.lifespan.shutdown(), FORCED_EXIT_S / 2)
            except TimeoutError:
                pass

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.signals == 1:
            self.should_exit = True  # uvicorn's main loop sees it within 0.1 s: listeners close
            self.fastapi_app.state.draining = True
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._begin_grace, signal.Signals(sig).name)
            return
        self.force_exit = True  # uvicorn stops waiting for connections and skips the lifespan shutdown
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._abort_all, "a second signal")
        timer = threading.Timer(FORCED_EXIT_S, os._exit, (1,))  # whatever still runs then is not waited for
        timer.daemon = True
        timer.start()

    def _begin_grace(self, name: str) -> None:
        llm = self.fastapi_app.state.llm
        logger.warning("%s: shutting down; %d request(s) in flight get %s s to finish (a second signal exits now)",
                       name, llm.num_requests, self.shutdown_timeout)
        self._grace = asyncio.ensure_future(self._end_grace())

    async def _end_grace(self) -> None:
        llm, loop = self.fastapi_app.state.llm, asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_timeout
        while llm.num_requests and loop.time() < deadline:
            await asyncio.sleep(0.05)
        self._abort_all(f"the {self.shutdown_timeout} s shutdown grace")

    def _abort_all(self, after: str) -> None:
        llm = self.fastapi_app.state.llm
        if llm.num_requests:
            logger.warning("aborting %d request(s) still running after %s", llm.num_requests, after)
        llm.abort_all("the server is shutting down and takes no new requests")
