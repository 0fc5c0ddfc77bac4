"""Request fields are honoured, refused by name or logged as ignored (``fields.py``), and
``core-runner serve`` with no model serves the demo as ``demo``."""
from __future__ import annotations

import logging

import pytest

from core_runner import LLM


@pytest.fixture(scope="module")
def client():
    from starlette.testclient import TestClient

    from core_runner.demo import demo_checkpoint
    from core_runner.entrypoints.openai.api_server import create_app

    engine = LLM(demo_checkpoint(), device="cpu", dtype="float32", max_model_len=64, max_num_seqs=2,
                 num_kv_blocks=16).engine
    with TestClient(create_app(engine)) as c:
        yield c


@pytest.mark.parametrize("path, field, value", [
    ("/v1/completions", "guided_decoding_backend", "outlines"),
    ("/v1/completions", "use_beam_search", True),
    ("/v1/chat/completions", "skip_special_tokens", False),
    ("/v1/chat/completions", "chat_template_kwargs", {"enable_thinking": False}),
    ("/v1/embeddings", "add_special_tokens", False),
])
def test_a_known_field_the_server_cannot_honour_is_a_400_naming_it(client, path, field, value):
    body = {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "input": "hi", "max_tokens": 2,
            field: value}
    r = client.post(path, json={k: v for k, v in body.items() if k in _needed(path) or k == field})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and field in err["message"] and "not supported" in err["message"]


def _needed(path: str) -> set[str]:
    return {"/v1/completions": {"prompt", "max_tokens"}, "/v1/chat/completions": {"messages", "max_tokens"},
            "/v1/embeddings": {"input"}}[path]


def test_a_refused_field_at_its_harmless_default_is_accepted(client):
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "skip_special_tokens": True,
                                             "use_beam_search": False, "user": "u-1"})
    assert r.status_code == 200, r.text


def test_unknown_fields_are_served_and_logged_by_name(client, caplog):
    with caplog.at_level(logging.WARNING, logger="core_runner.entrypoints.openai.fields"):
        r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "frobnicate": 1, "zz_new": "x"})
        assert r.status_code == 200, r.text
        r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "top_k": 5, "seed": 1})
        assert r.status_code == 200, r.text
    said = [rec.getMessage() for rec in caplog.records]
    assert len(said) == 1 and "/v1/completions" in said[0] and "'frobnicate', 'zz_new'" in said[0], said


def test_serve_without_a_model_names_it_demo(monkeypatch):
    import core_runner
    from core_runner import cli
    from core_runner.entrypoints.openai import api_server

    seen = {}

    class FakeLLM:
        def __init__(self, model, **options):
            seen["model"], self.engine = model, "engine"

    monkeypatch.setattr(core_runner, "LLM", FakeLLM)
    monkeypatch.setenv("CORE_RUNNER_ENABLE_MULTIPROCESSING", "0")  # the in-process engine
    monkeypatch.setattr(api_server, "serve", lambda engine, **kw: seen.update(kw))
    a = cli.build_parser().parse_args(["serve"])
    assert a.func(a) == 0
    assert seen["served_model_name"] == "demo" and "demo" in seen["model"]
    a = cli.build_parser().parse_args(["serve", "--served-model-name", "mine"])
    assert a.func(a) == 0 and seen["served_model_name"] == "mine"
