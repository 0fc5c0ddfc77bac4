"""Tool calls and reasoning through the server with the real ``openai`` client, on a
scripted model output: a logits hook (``engine.debug.on_logits``) makes every request
emit the tokens of a fixed text and then EOS, so the parsers see a known output."""
from __future__ import annotations

import json
import shutil

import openai
import pytest

from core_runner import LLM
from core_runner.entrypoints.openai.tools import ChatOptions, template_messages
from tests.test_server import _Server

TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] %}{{ m['content'] }}"
    "{% endif %}{% for c in m.get('tool_calls') or [] %}<tool_call>\n"
    "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}\n</tool_call>"
    "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
OPTS = dict(device="cpu", dtype="float32", max_model_len=512, max_num_seqs=4, num_kv_blocks=4 * 32)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
OUTPUT = ('<think>The user wants the weather.</think>\n\nLet me look. <tool_call>\n'
          '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
MSGS = [{"role": "user", "content": "Weather in Paris?"}]


class Script:
    """Forces each request's tokens to ``self.ids`` then EOS (requests run one at a time)."""

    def __init__(self, tok) -> None:
        self.tok, self.ids, self.pos = tok, [], {}

    def say(self, text: str) -> None:
        self.ids = self.tok.encode(text, add_special_tokens=False)
        assert self.tok.decode(self.ids) == text

    def __call__(self, req_ids, logits) -> None:
        for i, r in enumerate(req_ids):
            k = self.pos[r] = self.pos.get(r, -1) + 1
            logits[i] = -1e9
            logits[i, self.ids[k] if k < len(self.ids) else self.tok.eos_token_id] = 0.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from core_runner.demo import demo_checkpoint

    path = tmp_path_factory.mktemp("tools") / "demo-tools"
    shutil.copytree(demo_checkpoint(), path)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    engine = LLM(str(path), **OPTS).engine
    script = Script(engine.tokenizer)
    engine.debug.on_logits(script)
    s = _Server(engine, served_model_name="demo", chat_options=ChatOptions("hermes", True, "qwen3"))
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
    yield s, client, script, engine.tokenizer
    s.stop()


@pytest.fixture(scope="module")
def ckpt_path(served):
    return served[0].app.state.llm.engine.config.model


def test_auto_tool_call_and_reasoning(served):
    _, client, script, tok = served
    script.say(OUTPUT)
    r = client.chat.completions.create(model="demo", messages=MSGS, tools=TOOLS, max_tokens=200)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content == "Let me look."
    assert ch.message.reasoning_content == "The user wants the weather."
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    # the tools reached the template: the prompt is the template's rendering with them
    want = tok.apply_chat_template(MSGS, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert r.usage.prompt_tokens == len(tok.encode(want, add_special_tokens=False))
    assert r.usage.prompt_tokens > len(tok.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=True))


def test_auto_streamed_deltas(served):
    _, client, script, _ = served
    script.say(OUTPUT)
    stream = client.chat.completions.create(model="demo", messages=MSGS, tools=TOOLS, max_tokens=200, stream=True)
    content = reasoning = ""
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in stream:
        for ch in chunk.choices:
            d = ch.delta
            content += d.content or ""
            reasoning += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                if tc.function.name:
                    assert not c["name"], "the name comes once, before the arguments"
                    c["name"] = tc.function.name
                c["arguments"] += tc.function.arguments or ""
            reasons.append(ch.finish_reason)
    assert reasoning == "The user wants the weather." and content.strip() == "Let me look."
    assert list(calls) == [0] and calls[0]["id"].startswith("chatcmpl-tool-")
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert reasons[-1] == "tool_calls"


def test_tool_history_and_none(served):
    _, client, script, tok = served
    script.say("It is sunny.")
    msgs = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    r = client.chat.completions.create(model="demo", messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=50)
    assert r.choices[0].message.content == "It is sunny." and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"
    want = tok.apply_chat_template(template_messages(msgs), tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert '"arguments": {"city": "Paris"}' in want and "sunny, 21 C" in want
    assert r.usage.prompt_tokens == len(tok.encode(want, add_special_tokens=False))


def test_refusals_by_name(served):
    _, client, _, _ = served
    with pytest.raises(openai.BadRequestError, match="get_wether") as e:
        client.chat.completions.create(model="demo", messages=MSGS, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "get_wether"}})
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(model="demo", messages=MSGS, tools=[{"type": "function", "function": {}}])


def test_named_choice(served):
    """Named: the output is constrained to the function's parameters (structured outputs);
    refused by name where this build has no core_runner.structured_outputs."""
    _, client, script, _ = served
    script.say('{"city": "Oslo"}')
    named = {"type": "function", "function": {"name": "get_weather"}}
    try:
        import core_runner.structured_outputs  # noqa: F401
    except ImportError:
        with pytest.raises(openai.BadRequestError, match="requires structured outputs"):
            client.chat.completions.create(model="demo", messages=MSGS, tools=TOOLS, tool_choice=named)
        pytest.skip("core_runner.structured_outputs is absent: named and required tool choices are refused")
    r = client.chat.completions.create(model="demo", messages=MSGS, tools=TOOLS, tool_choice=named, max_tokens=50)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}
    script.say('[{"name": "get_weather", "parameters": {"city": "Oslo"}}]')
    r = client.chat.completions.create(model="demo", messages=MSGS, tools=TOOLS, tool_choice="required",
                                       max_tokens=80)
    assert r.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]


def test_offline_chat_gets_tools(ckpt_path):
    out = LLM(ckpt_path, **OPTS).chat(MSGS, _greedy(1), tools=TOOLS, use_tqdm=False)[0]
    assert '"name": "get_weather"' in out.prompt and out.prompt.endswith("<|im_start|>assistant\n")


def _greedy(n: int):
    from core_runner import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0.0)
