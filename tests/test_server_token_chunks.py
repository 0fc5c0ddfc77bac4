"""A streamed completion sends a chunk for every step's tokens, also when their text is empty:
a checkpoint without a tokenizer (token-id prompts, as the GPU benchmarks serve) or a token
that ends inside a character. Without that, the first chunk waited for the request to end."""
from __future__ import annotations

import json
import shutil

import httpx
import pytest
from serving_helpers import ThreadedServer

from core_runner import LLM

MAX_TOKENS = 24


class _Server(ThreadedServer):
    def __init__(self, engine) -> None:
        from core_runner.entrypoints.openai.api_server import create_app

        self.app = create_app(engine, served_model_name="bare")
        self._start()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from core_runner.demo import demo_checkpoint

    path = tmp_path_factory.mktemp("bare") / "no-tokenizer"
    shutil.copytree(demo_checkpoint(), path)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocabulary.txt"):
        (path / f).unlink(missing_ok=True)
    llm = LLM(str(path), device="cpu", dtype="float32", max_model_len=128, max_num_seqs=4, num_kv_blocks=64)
    assert llm.engine.tokenizer is None
    s = _Server(llm.engine)
    yield s
    s.stop()


def _events(server, body: dict) -> list[dict]:
    events = []
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    return events


def test_tokens_without_text_still_stream_one_chunk_a_step(server):
    body = {"model": "bare", "prompt": [5, 17, 42, 99, 7], "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    events = _events(server, body)
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert events[-1]["usage"]["completion_tokens"] == MAX_TOKENS
    assert all(c["text"] == "" for c in choices)  # no tokenizer: no text, but the tokens were made
    assert [c["finish_reason"] for c in choices][-1] == "length"
    # one chunk a step (a client that fell behind may get some steps merged into one chunk)
    early = [c for c in choices if c["finish_reason"] is None]
    assert len(early) >= MAX_TOKENS // 4, f"{len(early)} chunks before the last of {MAX_TOKENS} tokens"
