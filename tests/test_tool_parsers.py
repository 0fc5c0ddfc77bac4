"""Tool-call and reasoning parsers on fixed texts: whole outputs, and the same outputs fed
in pieces of every size (the streamed deltas must add up to the whole-output answer)."""
from __future__ import annotations

import json

import pytest

from core_runner.entrypoints.openai.protocol import APIError
from core_runner.entrypoints.openai.reasoning_parsers import get_reasoning_parser
from core_runner.entrypoints.openai.tool_parsers import get_tool_parser
from core_runner.entrypoints.openai.tools import ChatOptions, template_messages, tool_choice_schema

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
HERMES = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


def _stream(parser_cls, text: str, size: int):
    p, content, calls = parser_cls(), "", {}
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    for out in [p.feed(x) for x in pieces] + [p.finish()]:
        content += out[0]
        for d in out[1]:
            c = calls.setdefault(d["index"], {"name": "", "arguments": "", "id": None})
            c["id"] = c["id"] or d.get("id")
            c["name"] += d["function"].get("name", "")
            c["arguments"] += d["function"].get("arguments", "")
    return content, [calls[i] for i in sorted(calls)]


def test_hermes_whole_and_streamed():
    cls = get_tool_parser("hermes")
    content, calls = cls().extract(HERMES)
    assert content == "Let me check."
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                       ("get_time", {})]
    for size in (1, 2, 3, 7, 1000):
        s_content, s_calls = _stream(cls, HERMES, size)
        assert s_content.strip() == content, size
        assert [(c["name"], json.loads(c["arguments"])) for c in s_calls] == \
            [(c["name"], json.loads(c["arguments"])) for c in calls]
        assert all(c["id"].startswith("chatcmpl-tool-") for c in s_calls)
    # the arguments stream as they come: fed a token at a time, they arrive in several fragments
    p = cls()
    frags = [d for x in HERMES for d in p.feed(x)[1] if d["function"].get("arguments")]
    assert len([d for d in frags if d["index"] == 0]) > 3
    assert "".join(d["function"]["arguments"] for d in frags if d["index"] == 0) == '{"city": "Paris"}'


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_hermes_nested_and_reordered(size):
    cls = get_tool_parser("hermes")
    text = ('<tool_call>{"name": "f", "arguments": {"a": {"b": [1, {"c": "}{{"}]}, "d": 2}}</tool_call>'
            '<tool_call>{"arguments": {"x": 1}, "name": "g"}</tool_call>')
    want = [("f", {"a": {"b": [1, {"c": "}{{"}]}, "d": 2}), ("g", {"x": 1})]
    assert [(c["name"], json.loads(c["arguments"])) for c in cls().extract(text)[1]] == want
    content, calls = _stream(cls, text, size)
    assert content == "" and [(c["name"], json.loads(c["arguments"])) for c in calls] == want


def test_hermes_plain_text_bad_json_and_unclosed():
    cls = get_tool_parser("hermes")
    assert cls().extract("no calls < here") == ("no calls < here", [])
    bad = "x <tool_call>{not json}</tool_call>"
    assert cls().extract(bad) == (bad, [])
    assert _stream(cls, bad, 2) == (bad, [])
    unclosed = 'ok <tool_call>{"name": "get_time", "arguments": {}}'  # EOS right after the JSON
    assert _stream(cls, unclosed, 3)[1][0]["name"] == "get_time"
    assert _stream(cls, "a <tool", 1) == ("a <tool", [])  # a held-back marker prefix comes out at the end


def test_llama3_json():
    cls = get_tool_parser("llama3_json")
    text = ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}; '
            '{"name": "get_time", "parameters": {}}')
    content, calls = cls().extract(text)
    assert content is None and [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Rome"}
    for size in (1, 5, 1000):
        assert [(c["name"], c["arguments"]) for c in _stream(cls, text, size)[1]] == \
            [(c["name"], c["arguments"]) for c in calls]
    assert cls().extract("The answer is 4.") == ("The answer is 4.", [])
    assert _stream(cls, "The answer is 4.", 2) == ("The answer is 4.", [])
    assert cls().extract('{"broken": ') == ('{"broken": ', [])


def _reason_stream(name: str, text: str, size: int) -> tuple[str, str]:
    p, r, c = get_reasoning_parser(name)(), "", ""
    for x in [text[i:i + size] for i in range(0, len(text), size)]:
        dr, dc = p.feed(x)
        r, c = r + dr, c + dc
    dr, dc = p.finish()
    return r + dr, c + dc


@pytest.mark.parametrize("size", [1, 2, 4, 1000])
def test_reasoning_parsers(size):
    qwen3 = get_reasoning_parser("qwen3")()
    assert qwen3.split("<think>step 1</think>\n\nThe end.") == ("step 1", "The end.")
    assert qwen3.split("No thinking.") == (None, "No thinking.")
    assert _reason_stream("qwen3", "<think>step 1</think>\n\nThe end.", size) == ("step 1", "The end.")
    assert _reason_stream("qwen3", "No thinking.", size) == ("", "No thinking.")
    r1 = get_reasoning_parser("deepseek_r1")()
    assert r1.split("hmm</think>Done") == ("hmm", "Done")
    assert r1.split("cut short") == ("cut short", "")
    assert _reason_stream("deepseek_r1", "hmm</think>Done", size) == ("hmm", "Done")
    assert _reason_stream("deepseek_r1", "cut <short", size) == ("cut <short", "")


def test_unknown_parsers_named():
    with pytest.raises(ValueError, match="'nope' is unknown; valid: hermes, llama3_json"):
        get_tool_parser("nope")
    with pytest.raises(ValueError, match="deepseek_r1, qwen3"):
        get_reasoning_parser("nope")
    with pytest.raises(ValueError, match="--enable-auto-tool-choice needs --tool-call-parser"):
        ChatOptions(enable_auto_tool_choice=True)


def test_plan_validation():
    auto = ChatOptions("hermes", True)
    with pytest.raises(APIError, match="'get_wether', which is not in tools") as e:
        auto.plan({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_wether"}}})
    assert e.value.param == "tool_choice"
    with pytest.raises(APIError, match="requires --enable-auto-tool-choice and --tool-call-parser"):
        ChatOptions().plan({"tools": TOOLS})  # auto is the default with tools
    assert ChatOptions().plan({"tools": TOOLS, "tool_choice": "none"}).tools == TOOLS
    with pytest.raises(APIError, match="tool_choice='sometimes' is invalid"):
        auto.plan({"tools": TOOLS, "tool_choice": "sometimes"})
    with pytest.raises(APIError, match="needs tools"):
        auto.plan({"tool_choice": "required"})
    with pytest.raises(APIError, match=r"tools\[0\].function.name"):
        auto.plan({"tools": [{"type": "function", "function": {}}]})


def test_required_and_named_schema():
    named = tool_choice_schema(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    assert named == TOOLS[0]["function"]["parameters"]
    req = tool_choice_schema(TOOLS, "required", parallel=False)
    assert req["type"] == "array" and req["minItems"] == 1 and req["maxItems"] == 1
    branches = req["items"]["anyOf"]
    assert [b["properties"]["name"]["enum"] for b in branches] == [["get_weather"], ["get_time"]]
    assert branches[0]["properties"]["parameters"] == TOOLS[0]["function"]["parameters"]


def test_required_and_named_need_structured_outputs():
    """Refused by name on a build without core_runner.structured_outputs; built otherwise."""
    try:
        import core_runner.structured_outputs  # noqa: F401
    except ImportError:
        with pytest.raises(APIError, match="requires structured outputs"):
            ChatOptions().plan({"tools": TOOLS, "tool_choice": "required"})
        return
    plan = ChatOptions().plan({"tools": TOOLS, "tool_choice": "required"})
    assert plan.constraint.json == tool_choice_schema(TOOLS, "required")
    with pytest.raises(APIError, match="cannot be combined with response_format"):
        ChatOptions().plan({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}})


def test_history_arguments_become_objects():
    msgs = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]
    out = template_messages(msgs)
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {"tz": "UTC"} and out[1] == msgs[1]
    with pytest.raises(APIError, match="not JSON"):
        template_messages([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}])


def test_cli_serve_passes_the_parsers(monkeypatch):
    from core_runner import cli
    from core_runner.entrypoints.openai import api_server

    seen = {}
    monkeypatch.setenv("CORE_RUNNER_ENABLE_MULTIPROCESSING", "0")  # the in-process engine
    monkeypatch.setattr(api_server, "serve", lambda engine, **kw: seen.update(kw))
    base = ["serve", "--device", "cpu", "--dtype", "float32", "--num-kv-blocks", "16", "--max-model-len", "64"]
    assert cli.main(base + ["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json",
                            "--reasoning-parser", "deepseek_r1"]) == 0
    opts = seen["chat_options"]
    assert (opts.tool_call_parser, opts.enable_auto_tool_choice, opts.reasoning_parser) == \
        ("llama3_json", True, "deepseek_r1")
    seen.clear()
    assert cli.main(base + ["--enable-auto-tool-choice"]) == 2 and not seen  # refused before the model loads
    assert cli.main(base + ["--tool-call-parser", "mistral"]) == 2 and not seen
