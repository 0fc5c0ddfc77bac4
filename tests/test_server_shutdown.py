"""SIGTERM on ``core-runner serve`` (a subprocess serving the demo on 127.0.0.1): in-flight
streams get ``--shutdown-timeout`` seconds, then end with finish_reason "abort", and the
process exits; a second signal exits at once. Every wait is bounded."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest


class _Serve:
    def __init__(self, tmp_path, shutdown_timeout: float) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / "serve.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "core_runner.cli", "serve", "--port", str(self.port), "--device", "cpu",
                 "--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "4", "--num-kv-blocks", "520",
                 "--served-model-name", "demo", "--shutdown-timeout", str(shutdown_timeout)],
                stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while True:
            assert self.proc.poll() is None, f"serve exited: {self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"serve did not start: {self.log.read_text()[-3000:]}"
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)

    def streams(self, n: int) -> tuple[list[dict], threading.Event]:
        """``n`` long streamed completions in threads; each result holds its last
        finish_reason or the exception that ended it. The event is set once every stream
        has had its first token."""
        results: list[dict] = [{} for _ in range(n)]
        started = [threading.Event() for _ in range(n)]
        client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=60)

        def one(i: int) -> None:
            try:
                for c in client.completions.create(model="demo", prompt="Once upon a time", max_tokens=1800,
                                                   stream=True, extra_body={"ignore_eos": True}):
                    started[i].set()
                    if c.choices and c.choices[0].finish_reason:
                        results[i]["finish_reason"] = c.choices[0].finish_reason
                results[i]["done"] = True
            except Exception as e:  # the connection went away
                results[i]["error"] = e
            started[i].set()

        for i in range(n):
            threading.Thread(target=one, args=(i,), daemon=True).start()
        all_started = threading.Event()
        threading.Thread(target=lambda: ([e.wait(60) for e in started], all_started.set()), daemon=True).start()
        return results, all_started

    def exit_within(self, seconds: float) -> float:
        start = time.monotonic()
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            pytest.fail(f"serve still ran {seconds} s after the signal: {self.log.read_text()[-3000:]}")
        return time.monotonic() - start

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def test_sigterm_gives_streams_the_grace_then_aborts_them_and_exits(tmp_path):
    s = _Serve(tmp_path, shutdown_timeout=2)
    try:
        results, started = s.streams(2)
        assert started.wait(60), "the streams did not start"
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        try:  # no new work: the listener is closed (or the request is refused with a 503)
            r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=5)
            assert r.status_code == 503, r.text
        except httpx.ConnectError:
            pass
        took = s.exit_within(2 + 8)
        assert took > 1.0, "exited before the grace ended although streams were running"
        assert s.proc.returncode == 0, s.log.read_text()[-3000:]
        assert [r.get("finish_reason") for r in results] == ["abort", "abort"], results
        assert all(r.get("done") for r in results), results
        assert "aborting 2 request(s) still running after the 2.0 s shutdown grace" in s.log.read_text()
    finally:
        s.kill()


def test_a_second_sigterm_exits_at_once(tmp_path):
    s = _Serve(tmp_path, shutdown_timeout=60)
    try:
        results, started = s.streams(2)
        assert started.wait(60), "the streams did not start"
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        s.proc.send_signal(signal.SIGTERM)
        s.exit_within(4)  # not the 60 s grace
    finally:
        s.kill()
