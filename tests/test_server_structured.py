"""Structured outputs through the server with the real openai client: response_format
(json_schema, json_object) in chat, ``client.beta.chat.completions.parse`` with a pydantic
model, vLLM's ``structured_outputs`` extra body and ``guided_choice`` in completions, and
refusals by name (a schema xgrammar cannot compile, two constraints at once)."""
from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel
from test_server import API_KEY, OPTS, _Server, chat_ckpt  # noqa: F401 (fixture)

from core_runner import LLM

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["s", "m", "l"]}},
          "required": ["ok", "size"]}
COMPACT = {"structured_outputs": {"disable_any_whitespace": True}}  # the tiny demo model loves newlines
MSGS = [{"role": "user", "content": "Answer in JSON"}]


class Answer(BaseModel):
    ok: bool
    size: Literal["s", "m", "l"]


@pytest.fixture(scope="module")
def client(chat_ckpt):  # noqa: F811
    s = _Server(LLM(chat_ckpt, **OPTS).engine, served_model_name="demo", api_key=API_KEY)
    yield openai.OpenAI(base_url=s.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    s.stop()


def _is_answer(v: dict) -> bool:
    return set(v) == {"ok", "size"} and isinstance(v["ok"], bool) and v["size"] in ("s", "m", "l")


def test_chat_response_format_json_schema_and_object(client):
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(model="demo", messages=MSGS, response_format=rf, max_tokens=120,
                                       temperature=0.0, extra_body=COMPACT)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert _is_answer(json.loads(r.choices[0].message.content))
    r = client.chat.completions.create(model="demo", messages=MSGS, response_format={"type": "json_object"},
                                       max_tokens=12, temperature=0.0)
    assert r.choices[0].message.content.startswith("{")


def test_beta_parse_returns_the_pydantic_object(client):
    if not hasattr(getattr(client, "beta", None), "chat"):
        pytest.skip("this openai client has no beta.chat.completions.parse")
    r = client.beta.chat.completions.parse(model="demo", messages=MSGS, response_format=Answer, max_tokens=120,
                                           temperature=0.0, extra_body=COMPACT)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Answer) and parsed.size in ("s", "m", "l")


def test_completions_structured_outputs_extra_body_and_guided_choice(client):
    r = client.completions.create(model="demo", prompt="x", max_tokens=8, temperature=1.0, seed=3,
                                  extra_body={"structured_outputs": {"choice": ["left", "right"]}})
    assert r.choices[0].text in ("left", "right")
    r = client.completions.create(model="demo", prompt="y", max_tokens=12, temperature=1.0, seed=4,
                                  extra_body={"guided_regex": "[0-9]{3}"})
    assert len(r.choices[0].text) == 3 and r.choices[0].text.isdigit()


def test_bad_constraints_are_400_by_name(client):
    with pytest.raises(openai.BadRequestError, match="xgrammar"):
        client.completions.create(model="demo", prompt="x", max_tokens=4,
                                  extra_body={"structured_outputs": {"grammar": "root ::= nowhere"}})
    with pytest.raises(openai.BadRequestError, match="both given"):
        client.chat.completions.create(model="demo", messages=MSGS, max_tokens=4,
                                       response_format={"type": "json_object"},
                                       extra_body={"guided_choice": ["a"]})
