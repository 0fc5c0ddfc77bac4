"""One request's text side in the API process, when the engine core runs in its own process.

The core sends token ids (and logprobs, a pooled tensor, how a request finished); this
turns them into the ``Delta``s a ``RequestStream`` yields, as ``AsyncLLM`` does in-process:
streaming detokenization, and stop strings. The core never sees stop strings: a request
with some is detokenized here by the same ``IncrementalDetokenizer`` the offline engine
uses, with the scheduler's rules (none before ``min_tokens``; a stop token or EOS ends the
request before its text is looked at), so the text and ``stop_reason`` equal the offline
ones. When a stop string is found the final delta goes out at once and ``cut`` tells the
client to abort the request in the core (whose later tokens are dropped here).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from core_runner.engine.core_messages import tensor_from_wire
from core_runner.engine.detokenizer import IncrementalDetokenizer, StreamingText
from core_runner.engine.request_stream import Delta
from core_runner.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ApiRequest:
    request_id: str
    params: SamplingParams | None  # None: a pooling request
    num_prompt_tokens: int
    tokenizer: Any
    eos_token_ids: tuple[int, ...]
    queue: Any  # the RequestStream's asyncio.Queue
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    sent_text: str = ""
    decoded: str = ""
    cut: bool = False  # ended here by a stop string: the core still runs it until told to abort
    arrival: float = field(default_factory=time.perf_counter)
    last_token_time: float | None = None
    stream: StreamingText | None = None
    stops: IncrementalDetokenizer | None = None
    hold: int = 0  # characters held back from the stream: a stop string may still cut them

    def __post_init__(self) -> None:
        sp = self.params
        if sp is None:
            return
        if sp.stop:
            self.stops = IncrementalDetokenizer(self.tokenizer, sp.stop, skip_special_tokens=sp.skip_special_tokens,
                                                include_stop_str=sp.include_stop_str_in_output)
            self.hold = max(len(s) for s in sp.stop) - 1
        else:
            self.stream = StreamingText(self.tokenizer)

    def feed(self, out: Any) -> Delta | BaseException | None:
        """The delta for one core output of this request (None: nothing to tell), or the
        exception its stream raises (the core refused the request)."""
        if out.refused is not None:
            return ValueError(out.refused)
        if self.params is None:
            return self._pooled(out) if out.finish_reason is not None else None
        new, hit = self._take(out.new_token_ids)
        lps = None
        if self.params.logprobs is not None and out.new_logprobs is not None:
            lps = out.new_logprobs[:len(new)]
            self.logprobs.extend(lps)
        if hit is not None:
            self.cut = True
            return self._final(new, lps, "stop", hit)
        if out.finish_reason is not None:
            return self._final(new, lps, out.finish_reason, out.stop_reason)
        if not new:
            return None
        text = self.stops.text if self.stops is not None else self.decoded
        upto = max(len(self.sent_text), len(text) - self.hold)
        piece = text[len(self.sent_text):upto]
        self.sent_text += piece
        return Delta(self.request_id, new, piece, num_prompt_tokens=self.num_prompt_tokens,
                     num_output_tokens=len(self.token_ids), logprobs=lps)

    def _take(self, tokens: list[int]) -> tuple[list[int], str | None]:
        """Append the new tokens and their text; (the tokens kept, the stop string hit or None)."""
        sp = self.params
        for i, tok in enumerate(tokens):
            self.token_ids.append(tok)
            if self.stops is None:
                self.decoded += self.stream.add(tok)
                continue
            past_min = len(self.token_ids) >= sp.min_tokens
            if past_min and (tok in sp.stop_token_ids or (not sp.ignore_eos and tok in self.eos_token_ids)):
                return tokens[:i + 1], None  # the core ended the request on this token, before its text
            hit = self.stops.append(tok, check_stop=past_min)
            if hit is not None:
                return tokens[:i + 1], hit
        return tokens, None

    def _final(self, new: list[int], lps: list | None, reason: str, stop_reason: int | str | None) -> Delta:
        sp = self.params
        if self.stops is not None:
            text = self.stops.text  # cut at the stop string
        elif self.tokenizer is not None and self.token_ids:  # the whole output at once, as the offline engine does
            text = self.tokenizer.decode(self.token_ids, skip_special_tokens=sp.skip_special_tokens)
        else:
            text = ""
        if text.startswith(self.sent_text):
            rest = text[len(self.sent_text):]
        else:  # the streamed text and the final one disagree: keep the stream consistent
            logger.warning("request %r: streamed text %r is not a prefix of the final text %r",
                           self.request_id, self.sent_text, text)
            rest = ""
        cumulative = None
        if sp.logprobs is not None and reason not in ("abort", "error"):
            cumulative = sum(lp[t] for lp, t in zip(self.logprobs, self.token_ids))
        return Delta(self.request_id, new, rest, finished=True, finish_reason=reason, stop_reason=stop_reason,
                     num_prompt_tokens=self.num_prompt_tokens, num_output_tokens=len(self.token_ids),
                     logprobs=lps, cumulative_logprob=cumulative)

    def _pooled(self, out: Any) -> Delta:
        vec = tensor_from_wire(out.pooled) if out.pooled is not None else None
        return Delta(self.request_id, [], "", finished=True, finish_reason=out.finish_reason,
                     num_prompt_tokens=self.num_prompt_tokens, embedding=vec)
