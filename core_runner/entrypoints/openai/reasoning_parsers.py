"""Reasoning parsers (``--reasoning-parser``): a ``<think>...</think>`` span of the model's
output goes to ``reasoning_content``, the rest to ``content`` (vLLM's names "qwen3" and
"deepseek_r1").

- "qwen3": the model writes ``<think>`` itself. Non-streamed, an output without
  ``</think>`` is all content (vLLM's rule: thinking was off or cut); streamed, the text
  after a leading ``<think>`` is sent as reasoning as it comes.
- "deepseek_r1": the chat template ends the prompt with ``<think>``, so the output starts in
  reasoning (a leading ``<think>`` is dropped too); all of it is reasoning until ``</think>``.

Other parsers register by entry point in the group ``core_runner.reasoning_parsers`` (a
class with the same methods as ``ThinkParser``).
"""
from __future__ import annotations

from core_runner.entrypoints.openai.parser_registry import find_parser
from core_runner.entrypoints.openai.text_split import safe_prefix

START, END = "<think>", "</think>"


class ThinkParser:
    """One choice's parser: ``split(text)`` for a whole output, ``feed(delta)`` then
    ``finish()`` for a stream; each returns (reasoning, content)."""

    starts_in_reasoning = False

    def __init__(self) -> None:
        self._buf = ""
        self._state = "start"  # start -> (reasoning ->) content

    def split(self, text: str) -> tuple[str | None, str]:
        body = text.lstrip()
        if body.startswith(START):
            body = body[len(START):]
        elif not self.starts_in_reasoning:
            return None, text
        if END not in body:
            return (body, "") if self.starts_in_reasoning else (None, text)
        reasoning, content = body.split(END, 1)
        return reasoning, content.lstrip("\n")

    def feed(self, delta: str) -> tuple[str, str]:
        self._buf += delta
        reasoning = content = ""
        if self._state == "start":
            body = self._buf.lstrip()
            if START.startswith(body):  # maybe a <think> still coming (or only whitespace so far)
                if body == START:
                    self._buf, self._state = "", "reasoning"
                return "", ""
            if body.startswith(START):
                self._buf, self._state = body[len(START):], "reasoning"
            elif self.starts_in_reasoning:
                self._state = "reasoning"
            else:
                self._state = "content"
        if self._state == "reasoning":
            if END in self._buf:
                reasoning, rest = self._buf.split(END, 1)
                self._buf, self._state = rest.lstrip("\n"), "after"
                if not self._buf:
                    return reasoning, ""
            else:
                cut = safe_prefix(self._buf, END)
                reasoning, self._buf = self._buf[:cut], self._buf[cut:]
                return reasoning, ""
        if self._state == "after":  # the newlines after </think> are dropped, as in split()
            self._buf = self._buf.lstrip("\n")
            if not self._buf:
                return reasoning, ""
            self._state = "content"
        content, self._buf = self._buf, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What was held back, once the output has ended."""
        rest, self._buf = self._buf, ""
        if self._state == "reasoning" or (self._state == "start" and self.starts_in_reasoning):
            return rest, ""
        return "", rest


class Qwen3ReasoningParser(ThinkParser):
    starts_in_reasoning = False


class DeepSeekR1ReasoningParser(ThinkParser):
    starts_in_reasoning = True


REASONING_PARSERS: dict[str, type] = {"qwen3": Qwen3ReasoningParser, "deepseek_r1": DeepSeekR1ReasoningParser}
GROUP = "core_runner.reasoning_parsers"


def get_reasoning_parser(name: str) -> type:
    """The parser class registered as ``name`` (built in, or by entry point)."""
    return find_parser(name, REASONING_PARSERS, GROUP, "--reasoning-parser")
