"""Incremental detokenisation and stop strings.

Decoding the whole output every step is quadratic; decoding one token alone breaks
multi-byte characters and word-boundary spacing. The usual middle way (as in TGI and
vLLM): decode a short window of recent tokens twice, with and without the new token,
and append the difference, holding back text that ends in an incomplete character
(U+FFFD). Stop strings are looked for only in the text that could contain a new match.
"""
from __future__ import annotations

from typing import Any

try:  # tokenizers >= 0.21
    from tokenizers.decoders import DecodeStream
except ImportError:  # pragma: no cover - older tokenizers: the incremental detokenizer below
    DecodeStream = None


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer: Any, stop: list[str], skip_special_tokens: bool = True, include_stop_str: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.include_stop_str = include_stop_str
        self.stop = list(stop)
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # window start
        self._read = 0  # tokens whose text is already in self.text
        self._max_stop = max((len(s) for s in self.stop), default=0)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def append(self, token: int, check_stop: bool = True) -> str | None:
        """Add one token; returns the stop string it completed (the text is then cut
        just before it, or just after it with ``include_stop_str``), or None.
        ``check_stop=False`` before min_tokens is reached."""
        self.ids.append(token)
        before = self._decode(self.ids[self._prefix: self._read])
        after = self._decode(self.ids[self._prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return None
        old_len = len(self.text)
        self.text += after[len(before):]
        self._prefix, self._read = self._read, len(self.ids)
        if not check_stop or not self.stop:
            return None
        # a new match must end in the new text, so it starts at most max_stop - 1 before it
        start = max(0, old_len - self._max_stop + 1)
        best = None
        for s in self.stop:
            at = self.text.find(s, start)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, s)
        if best is None:
            return None
        self.text = self.text[: best[0] + (len(best[1]) if self.include_stop_str else 0)]
        return best[1]


class StreamingText:
    """Streaming detokenization of one request's output (special tokens skipped), for a
    server's deltas: the tokenizers library's DecodeStream where the tokenizer is a fast
    one, else the incremental detokenizer above."""

    def __init__(self, tokenizer: Any) -> None:
        self._fast = getattr(tokenizer, "_tokenizer", None) if DecodeStream is not None else None
        if self._fast is not None:
            self._stream = DecodeStream(skip_special_tokens=True)
        else:
            self._detok = IncrementalDetokenizer(tokenizer, []) if tokenizer is not None else None

    def add(self, token: int) -> str:
        if self._fast is not None:
            return self._stream.step(self._fast, token) or ""
        if self._detok is None:
            return ""
        before = len(self._detok.text)
        self._detok.append(token, check_stop=False)
        return self._detok.text[before:]
