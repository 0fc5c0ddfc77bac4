"""Tool parsers (``--tool-call-parser``): the tool calls in a model's output for
``tool_choice="auto"`` (vLLM's names "hermes" and "llama3_json").

- "hermes" (Hermes, Qwen2.5 / Qwen3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  any number of them; the text outside them is content.
- "llama3_json" (Llama 3.1 / 3.2 JSON tool calling): the whole output is
  ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``; several joined
  by ``;``); an output that does not start with ``{`` is content.

A block that is not valid JSON stays content (the client sees what the model wrote).
Streamed, a call's first delta has its index, id and name (arguments ""), the next ones its
arguments. Hermes streams them as they come once ``{"name": "...", "arguments": {`` has been
written (the fragments are the model's own text, so they join to the JSON it wrote; a block
that turns out broken after that has been partly sent, as in vLLM); other shapes, and
llama3_json, send the arguments in one delta when the JSON is complete. Other parsers register by entry point in the
group ``core_runner.tool_parsers`` (a class with ``extract``, ``feed`` and ``finish``).
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

from core_runner.entrypoints.openai.parser_registry import find_parser
from core_runner.entrypoints.openai.text_split import safe_prefix


def new_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def _call(obj: Any, args_key: tuple[str, ...]) -> dict | None:
    """{"name", "arguments": JSON string} from a parsed call object, or None if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = next((obj[k] for k in args_key if k in obj), {})
    if isinstance(args, str):  # some models write the arguments as a JSON string already
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}


class ToolParser:
    """One choice's parser. ``extract(text) -> (content or None, calls)``; streamed,
    ``feed(delta)`` and then ``finish()`` each return (content delta, tool-call deltas in
    OpenAI's streamed shape)."""

    def __init__(self) -> None:
        self._buf = ""
        self._sent = 0  # calls streamed so far: the next one's index

    def _deltas(self, calls: list[dict]) -> list[dict]:
        out = []
        for c in calls:
            i, self._sent = self._sent, self._sent + 1
            out.append({"index": i, "id": new_call_id(), "type": "function",
                        "function": {"name": c["name"], "arguments": ""}})
            out.append({"index": i, "function": {"arguments": c["arguments"]}})
        return out


class HermesToolParser(ToolParser):
    START, END = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self._in_call = False
        self._open: list[int] | None = None  # the call being streamed: [index, arguments start, sent up to]

    @staticmethod
    def _parse(block: str) -> dict | None:
        try:
            return _call(json.loads(block), ("arguments", "parameters"))
        except ValueError:
            return None

    def extract(self, text: str) -> tuple[str | None, list[dict]]:
        content, calls, rest = [], [], text
        while self.START in rest:
            before, after = rest.split(self.START, 1)
            block, closed, tail = after.partition(self.END)
            call = self._parse(block)
            if call is None:  # not a call: what the model wrote stays content
                content.append(before + self.START + block + closed)
            else:
                content.append(before)
                calls.append(call)
            rest = tail
        content.append(rest)
        text_out = "".join(content)
        if calls:
            text_out = text_out.strip()
        return (text_out or None), calls

    def feed(self, delta: str) -> tuple[str, list[dict]]:
        self._buf += delta
        content, out = "", []
        while True:
            if not self._in_call:
                if self.START not in self._buf:
                    cut = safe_prefix(self._buf, self.START)
                    piece, self._buf = self._buf[:cut], self._buf[cut:]
                    if not (self._sent and not piece.strip()):  # whitespace between calls is dropped
                        content += piece
                    return content, out
                before, self._buf = self._buf.split(self.START, 1)
                if not self._sent or before.strip():
                    content += before
                self._in_call, self._open = True, None
            if self.END not in self._buf:
                out += self._stream_open(self._buf, final=False)
                return content, out
            block, self._buf = self._buf.split(self.END, 1)
            self._in_call = False
            content += self._close(block, out)

    def _stream_open(self, block: str, final: bool) -> list[dict]:
        """Deltas of the call being written: its name once ``{"name": "...", "arguments": {``
        has come, then its arguments as they come (held back from the last ``}``, which may
        be the wrapper's, until ``final``)."""
        out = []
        if self._open is None:
            m = _HERMES_HEAD.match(block)
            if m is None:
                return out
            try:
                name = json.loads(f'"{m.group(1)}"')
            except ValueError:
                return out
            i, self._sent = self._sent, self._sent + 1
            self._open = [i, m.end() - 1, m.end() - 1]  # index, where the arguments start, how far sent
            out.append({"index": i, "id": new_call_id(), "type": "function",
                        "function": {"name": name, "arguments": ""}})
        i, start, sent = self._open
        args = block[start:]
        if final:  # the arguments object ends where a JSON decoder says (the wrapper's brace follows)
            try:
                args = args[:json.JSONDecoder().raw_decode(args)[1]]
            except ValueError:  # broken: send what was written, less the wrapper's brace
                args = args.rstrip().removesuffix("}")
        elif "}" in args:
            args = args[:args.rfind("}")]
        end = start + len(args)
        if end > sent:
            out.append({"index": i, "function": {"arguments": block[sent:end]}})
            self._open[2] = end
        return out

    def _close(self, block: str, out: list[dict]) -> str:
        """The end of a call's block: its last deltas into ``out``; the content it gives
        (the block itself when it is not a call and nothing of it was streamed)."""
        if self._open is None:
            call = self._parse(block)
            if call is None:
                return self.START + block + self.END
            out += self._deltas([call])
            return ""
        out += self._stream_open(block, final=True)
        self._open = None
        return ""

    def finish(self) -> tuple[str, list[dict]]:
        rest, self._buf = self._buf, ""
        if self._in_call:  # the output ended inside a call (no </tool_call>, e.g. EOS right after the JSON)
            self._in_call = False
            out: list[dict] = []
            if self._open is None and self._parse(rest) is None:
                return self.START + rest, []
            self._close(rest, out)
            return "", out
        return rest, []


# the head of a Hermes call written name first, arguments an object: its arguments can stream
_HERMES_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*\{')


class Llama3JsonToolParser(ToolParser):
    TAG = "<|python_tag|>"

    def __init__(self) -> None:
        super().__init__()
        self._mode = "start"  # start -> json (held until the end) | content

    def extract(self, text: str) -> tuple[str | None, list[dict]]:
        body = text.strip()
        if body.startswith(self.TAG):
            body = body[len(self.TAG):].lstrip()
        if not body.startswith("{"):
            return text, []
        dec, calls, pos = json.JSONDecoder(), [], 0
        try:
            while pos < len(body):
                obj, pos = dec.raw_decode(body, pos)
                call = _call(obj, ("parameters", "arguments"))
                if call is None:
                    return text, []
                calls.append(call)
                while pos < len(body) and body[pos] in " \t\r\n;":
                    pos += 1
        except ValueError:
            return text, []
        return None, calls

    def feed(self, delta: str) -> tuple[str, list[dict]]:
        self._buf += delta
        if self._mode == "start":
            head = self._buf.lstrip()
            if not head or (self.TAG.startswith(head) and head != self.TAG):
                return "", []
            self._mode = "json" if head.startswith(("{", self.TAG)) else "content"
        if self._mode == "json":
            return "", []
        out, self._buf = self._buf, ""
        return out, []

    def finish(self) -> tuple[str, list[dict]]:
        rest, self._buf = self._buf, ""
        if self._mode != "json":
            return rest, []
        content, calls = self.extract(rest)
        return (content or ""), self._deltas(calls)


TOOL_PARSERS: dict[str, type] = {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser}
GROUP = "core_runner.tool_parsers"


def get_tool_parser(name: str) -> type:
    """The parser class registered as ``name`` (built in, or by entry point)."""
    return find_parser(name, TOOL_PARSERS, GROUP, "--tool-call-parser")
