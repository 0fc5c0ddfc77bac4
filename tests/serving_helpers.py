"""What the server tests share: an app served by uvicorn in a thread on a free local port, and
the test logits processor installed by entry point (a dist-info on sys.path)."""
from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

from core_runner.logits_processor import ENTRY_POINT_GROUP

LP_FIXTURES = Path(__file__).parent / "fixtures_lp"


class ThreadedServer:
    """uvicorn serving ``self.app`` (set by the subclass before ``_start``) in a thread on
    127.0.0.1; ``stop()`` ends it."""

    app: object

    def _start(self) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.05)

    def stop(self, join_s: float = 15) -> None:
        self.server.should_exit = True
        self.thread.join(join_s)
        self.sock.close()
        assert not self.thread.is_alive(), "the server did not stop"


@contextlib.contextmanager
def lp_entry_point(root: Path) -> Iterator[None]:
    """While inside: ``cr_lp_fixture:TargetTokenProcessor`` installed under the logits
    processors' entry-point group (a dist-info written into ``root``, both on sys.path)."""
    dist = root / "cr_lp_fixture-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cr-lp-fixture\nVersion: 0.0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ntarget = cr_lp_fixture:TargetTokenProcessor\n")
    sys.path[:0] = [str(root), str(LP_FIXTURES)]
    try:
        yield
    finally:
        sys.path.remove(str(root))
        sys.path.remove(str(LP_FIXTURES))
