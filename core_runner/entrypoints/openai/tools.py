"""``tools`` / ``tool_choice`` and reasoning in /v1/chat/completions (vLLM's semantics).

- ``tool_choice="none"``: the template still gets the tools; the output is content.
- ``"auto"`` (the default when tools are given): the server needs ``--enable-auto-tool-choice``
  and ``--tool-call-parser`` (else 400, as vLLM); the parser finds the calls in the output.
- ``"required"`` and a named function: the output is constrained by a JSON schema
  (``tool_choice_schema``) through structured outputs. Named: the output is the function's
  arguments; required: a list of ``{"name", "parameters"}``.
- ``--reasoning-parser``: ``<think>`` spans go to ``reasoning_content`` (reasoning_parsers.py).

``ChatOptions.plan(body)`` checks the body and returns a ``ChatPlan``: what the template gets,
the sampling constraint, and per choice a ``ChoiceOutput`` that turns the output text into a
message (``message``) or into streamed deltas (``feed`` / ``finish``).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from core_runner.entrypoints.openai.protocol import APIError, _short
from core_runner.entrypoints.openai.reasoning_parsers import get_reasoning_parser
from core_runner.entrypoints.openai.tool_parsers import get_tool_parser, new_call_id

CHOICES = ("none", "auto", "required")
# body fields that constrain the output too (structured outputs: OpenAI's and vLLM's names)
_CONSTRAINT_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                      "guided_grammar")


def tool_choice_schema(tools: list[dict], tool_choice: Any, parallel: bool = True) -> dict:
    """The JSON schema the output must follow for a named ``tool_choice`` (the function's
    parameters) or ``"required"`` (an array of at least one {"name": const, "parameters"}
    object, one branch per tool; at most one item when ``parallel`` is False)."""
    def params(t: dict) -> dict:
        return t["function"].get("parameters") or {"type": "object", "properties": {}}

    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        return params(next(t for t in tools if t["function"]["name"] == name))
    if tool_choice != "required":
        raise ValueError(f"tool_choice {tool_choice!r} has no schema: only 'required' and a named function do")
    item = {"anyOf": [{"type": "object", "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                                                       "parameters": params(t)},
                       "required": ["name", "parameters"]} for t in tools]}
    schema: dict = {"type": "array", "minItems": 1, "items": item}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _structured_outputs_class():
    try:
        from core_runner.structured_outputs import StructuredOutputsParams
    except ImportError:
        return None
    return StructuredOutputsParams


def check_tools(tools: Any) -> list[dict]:
    if not isinstance(tools, list) or not tools:
        raise APIError(f"tools must be a non-empty list of {{type: function, function: {{name, parameters}}}} "
                       f"objects, got {_short(tools)}", "tools")
    names = set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise APIError(f"tools[{i}] must be {{type: 'function', function: {{...}}}}, got {_short(t)}", "tools")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise APIError(f"tools[{i}].function.name must be a non-empty string, got {_short(fn.get('name'))}",
                           "tools")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise APIError(f"tools[{i}].function.parameters must be a JSON schema object, got "
                           f"{_short(fn['parameters'])}", "tools")
        if fn["name"] in names:
            raise APIError(f"tools: the function name {fn['name']!r} is given twice", "tools")
        names.add(fn["name"])
    return tools


def template_messages(msgs: list[dict]) -> list[dict]:
    """Assistant ``tool_calls`` with their arguments as objects (what HF templates such as
    Llama 3's expect; Qwen's take either), as vLLM hands them to the template."""
    out = []
    for i, m in enumerate(msgs):
        calls = m.get("tool_calls")
        if calls is None:
            out.append(m)
            continue
        if not isinstance(calls, list):
            raise APIError(f"messages[{i}].tool_calls must be a list, got {_short(calls)}", "messages")
        fixed = []
        for c in calls:
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise APIError(f"messages[{i}].tool_calls: each must be {{id, type, function: {{name, arguments}}}}, "
                               f"got {_short(c)}", "messages")
            args = fn.get("arguments", "{}")
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except ValueError:
                    raise APIError(f"messages[{i}].tool_calls: arguments of {fn['name']!r} are not JSON: "
                                   f"{_short(args)}", "messages") from None
            fixed.append({**c, "function": {**fn, "arguments": args}})
        out.append({**m, "tool_calls": fixed})
    return out


@dataclass
class ChatOptions:
    """The server's settings: ``--tool-call-parser``, ``--enable-auto-tool-choice``,
    ``--reasoning-parser`` (names checked at construction)."""

    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser: str | None = None
    _tool_cls: type | None = field(default=None, init=False, repr=False)
    _reasoning_cls: type | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (e.g. hermes or llama3_json)")
        if self.tool_call_parser:
            self._tool_cls = get_tool_parser(self.tool_call_parser)
        if self.reasoning_parser:
            self._reasoning_cls = get_reasoning_parser(self.reasoning_parser)

    def plan(self, body: dict) -> ChatPlan:
        tools = body.get("tools")
        choice = body.get("tool_choice")
        if tools is None:
            if choice not in (None, "none"):
                raise APIError(f"tool_choice={_short(choice)} needs tools", "tool_choice")
            return ChatPlan(None, "none", None, None, self._reasoning_cls)
        tools = check_tools(tools)
        if choice is None:
            choice = "auto"
        parallel = body.get("parallel_tool_calls")
        if parallel is not None and not isinstance(parallel, bool):
            raise APIError(f"parallel_tool_calls must be true or false, got {_short(parallel)}", "parallel_tool_calls")
        parallel = parallel is not False
        if isinstance(choice, dict):
            fn = choice.get("function")
            name = fn.get("name") if isinstance(fn, dict) else None
            if choice.get("type") != "function" or not isinstance(name, str):
                raise APIError(f"tool_choice must be one of {list(CHOICES)} or {{type: 'function', function: "
                               f"{{name}}}}, got {_short(choice)}", "tool_choice")
            known = [t["function"]["name"] for t in tools]
            if name not in known:
                raise APIError(f"tool_choice names the function {name!r}, which is not in tools "
                               f"(tools: {', '.join(map(repr, known))})", "tool_choice")
        elif choice not in CHOICES:
            raise APIError(f"tool_choice={_short(choice)} is invalid: valid are {list(CHOICES)} or "
                           "{type: 'function', function: {name}}", "tool_choice")
        constraint = None
        if choice == "auto":
            if not (self.enable_auto_tool_choice and self._tool_cls is not None):
                raise APIError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
                               'set (tool_choice="auto" is the default when tools are given: pass tool_choice="none" '
                               "to only show the tools to the model)", "tool_choice")
        elif choice != "none":
            so = _structured_outputs_class()
            what = "required" if choice == "required" else f"a named function ({choice['function']['name']!r})"
            if so is None:
                raise APIError(f"tool_choice={what} requires structured outputs, which this build does not have "
                               "(use tool_choice 'auto' or 'none')", "tool_choice")
            other = next((k for k in _CONSTRAINT_FIELDS if body.get(k) not in (None, {"type": "text"})), None)
            if other is not None:  # one grammar per request: the tool schema or the body's
                raise APIError(f"tool_choice={what} constrains the output already; it cannot be combined with "
                               f"{other}", other)
            constraint = so(json=tool_choice_schema(tools, choice, parallel))
        return ChatPlan(tools, choice, constraint, self._tool_cls if choice == "auto" else None,
                        self._reasoning_cls, parallel)


@dataclass
class ChatPlan:
    tools: list[dict] | None
    tool_choice: Any
    constraint: Any  # StructuredOutputsParams or None
    tool_cls: type | None
    reasoning_cls: type | None
    parallel: bool = True

    def sampling(self, params):
        """``params`` with the tool constraint (for required / named)."""
        if self.constraint is None:
            return params
        return dataclasses.replace(params, structured_outputs=self.constraint)

    def choice(self) -> ChoiceOutput:
        return ChoiceOutput(self)


def _required_calls(text: str) -> list[dict]:
    """The calls of a ``"required"`` output (a JSON array of {name, parameters})."""
    try:
        items = json.loads(text)
    except ValueError:
        raise APIError(f"the output for tool_choice='required' is not the constrained JSON: {_short(text)}", None,
                       500, type="internal_server_error") from None
    return [{"name": it["name"], "arguments": json.dumps(it.get("parameters", {}), ensure_ascii=False)}
            for it in items]


def _message_calls(calls: list[dict]) -> list[dict]:
    return [{"id": new_call_id(), "type": "function", "function": c} for c in calls]


class ChoiceOutput:
    """One choice's output through the plan: ``message(text, finish_reason)`` for a whole
    output; ``feed(text)`` / ``finish()`` for a stream, each giving a list of delta dicts."""

    def __init__(self, plan: ChatPlan) -> None:
        self.plan = plan
        self.reasoning = plan.reasoning_cls() if plan.reasoning_cls else None
        self.tools = plan.tool_cls() if plan.tool_cls else None
        self.called = False
        self._held = ""  # "required": the JSON array, parsed at the end
        self._named_started = False

    def message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if self.reasoning is not None:
            msg["reasoning_content"], msg["content"] = self.reasoning.split(text)
        content = msg["content"]
        choice = self.plan.tool_choice
        calls: list[dict] = []
        if self.tools is not None:
            msg["content"], calls = self.tools.extract(content)
            if not self.plan.parallel:
                calls = calls[:1]
        elif isinstance(choice, dict):
            calls, msg["content"] = [{"name": choice["function"]["name"], "arguments": content}], None
        elif choice == "required":
            calls, msg["content"] = _required_calls(content), None
        msg["tool_calls"] = _message_calls(calls)
        # a named choice answers finish_reason "stop", as OpenAI and vLLM do
        if calls and finish_reason == "stop" and not isinstance(choice, dict):
            finish_reason = "tool_calls"
        self.called = bool(calls)
        return msg, finish_reason

    def _content(self, reasoning: str, content: str) -> list[dict]:
        out = [{"reasoning_content": reasoning}] if reasoning else []
        choice = self.plan.tool_choice
        if self.tools is not None:
            text, calls = self.tools.feed(content) if content is not None else self.tools.finish()
            if not self.plan.parallel:
                calls = [c for c in calls if c["index"] == 0]
            if text:
                out.append({"content": text})
            if calls:
                self.called = True
                out.append({"tool_calls": calls})
        elif isinstance(choice, dict) and content:
            if not self._named_started:
                self._named_started = self.called = True
                out.append({"tool_calls": [{"index": 0, "id": new_call_id(), "type": "function",
                                            "function": {"name": choice["function"]["name"], "arguments": ""}}]})
            out.append({"tool_calls": [{"index": 0, "function": {"arguments": content}}]})
        elif choice == "required":
            if content is None:
                calls = _required_calls(self._held)
                self.called = bool(calls)
                out += [{"tool_calls": [{"index": i, "id": new_call_id(), "type": "function", "function": c}]}
                        for i, c in enumerate(calls)]
            else:
                self._held += content
        elif content:
            out.append({"content": content})
        return out

    def feed(self, text: str) -> list[dict]:
        reasoning, content = self.reasoning.feed(text) if self.reasoning is not None else ("", text)
        return self._content(reasoning, content)

    def finish(self) -> list[dict]:
        out = []
        if self.reasoning is not None:
            reasoning, content = self.reasoning.finish()
            out = self._content(reasoning, content)
        return out + self._content("", None)

    def finish_reason(self, finish_reason: str | None) -> str | None:
        if self.called and finish_reason == "stop" and not isinstance(self.plan.tool_choice, dict):
            return "tool_calls"
        return finish_reason
