"""SamplingParams: per-request generation settings, validated on construction.

Checks that need the engine (the vocabulary size, ``EngineConfig.max_logprobs``, a
tokenizer for stop strings) happen in ``InputProcessor.validate_params`` at request time.
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any

from core_runner.structured_outputs.params import StructuredOutputsParams

# Ranges of the device tables the values are staged into (core_runner/sample/*: top_k is
# int32, seeds and token ids int64, the float knobs float32): a value outside them would
# fail, or silently change, inside a step instead of here.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    """A real number that float32 holds as a finite value (NaN and infinities refused)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and abs(x) <= FLOAT32_MAX


class AtMost(int):
    """``max_tokens=AtMost(n)``: at most n tokens, cut to what ``max_model_len`` leaves after
    the prompt, where a plain int above that is refused (as vLLM's server refuses it).
    Defaults are AtMost: SamplingParams' 16 and a checkpoint's ``max_new_tokens``
    (generation_config.json), as vLLM's server cuts its defaults. It equals, hashes, prints
    and serialises as the plain int, and ``dataclasses.replace`` keeps it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return int.__repr__(self)


DEFAULT_MAX_TOKENS = AtMost(16)


def _token_id_key(k: object) -> int | None:
    """A logit_bias key as a token id: an int (numpy's too; not a bool, whose int() is 0 or 1,
    nor a float, which int() would truncate: 1.7 -> 1) or a string of ASCII decimal digits, as
    JSON object keys arrive (not " 7 " or "1_0", which Python's int() would read); else None."""
    if isinstance(k, str):
        return int(k) if re.fullmatch(r"[0-9]+", k) else None
    if isinstance(k, bool):
        return None
    try:
        return operator.index(k)
    except TypeError:
        return None


@dataclass(slots=True)
class SamplingParams:
    """How to generate for one request (vLLM-compatible names).

    temperature 0 (or below 1e-5, where 1 / T would overflow) is greedy. ``top_k`` -1 means
    all tokens; ``top_p`` 1.0 and ``min_p`` 0.0 cut nothing; a token tied with the last one
    a cut keeps is kept too. ``seed`` makes sampling reproducible whatever batch or row the
    request runs in; unseeded requests get a seed at add time.

    Penalties follow vLLM: ``repetition_penalty`` (HF-style, on prompt and output
    tokens: positive logits divided, negative multiplied), ``frequency_penalty`` and
    ``presence_penalty`` (OpenAI-style, on output tokens: minus count x frequency, minus
    presence once). ``logit_bias`` adds to the logits of token ids: its keys are ints, or
    strings of decimal digits ("42", as JSON object keys arrive; vLLM's server reads them
    with int(), which also takes " 42 " and "4_2": refused here, as are floats and bools).
    While fewer than ``min_tokens`` tokens are out, EOS (unless ``ignore_eos``) and
    ``stop_token_ids`` cannot be sampled and stop strings are not checked.

    ``stop`` strings end generation when they appear in the detokenised output, which
    is cut just before them. ``logprobs`` k returns, per generated token, the log
    probabilities of the k most likely tokens and of the sampled one (with its rank);
    ``prompt_logprobs`` k does the same for every prompt token after the first. Both are
    of the raw model distribution, before penalties, bias and temperature; they come back
    as vLLM's ``{token id: Logprob(logprob, rank, decoded_token)}`` per position.

    vLLM's other names: ``max_tokens=None`` generates until ``max_model_len``; an explicit
    ``max_tokens`` above what ``max_model_len`` leaves after the prompt is refused when the
    request is added (the default 16 is cut to it, as is any ``AtMost(n)``); ``top_k`` 0
    is stored as -1 (both mean off); ``n`` > 1 gives n independent samples of one prompt
    (``LLM.generate`` runs them as n requests, seeded ``seed + i`` when ``seed`` is set);
    ``include_stop_str_in_output`` keeps the stop string at the end of the text;
    ``skip_special_tokens`` drops special tokens from the text. ``spaces_between_special_tokens``
    is accepted at its default (True) only: the detokenizer has no other spacing.

    ``structured_outputs`` (a ``StructuredOutputsParams``, or a dict of its fields) constrains
    the output to a JSON schema, regex, choice list or grammar (docs/structured_outputs.md).
    ``extra_args`` carries per-request arguments for logits-processor plugins, as vLLM's
    (a dict with string keys; each processor reads its own keys).
    """

    max_tokens: int | None = DEFAULT_MAX_TOKENS
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    n: int = 1
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    extra_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        def bad(name: str, valid: str) -> ValueError:
            return ValueError(f"SamplingParams.{name}={getattr(self, name)!r} is invalid: {valid}")

        def number_in(name: str, lo: float, hi: float, valid: str, lo_open: bool = False) -> None:
            v = getattr(self, name)
            if not _is_number(v) or not (lo < v if lo_open else lo <= v) or not v <= hi:
                raise bad(name, valid)

        self._check_vllm_fields(bad)
        number_in("temperature", 0.0, FLOAT32_MAX, "expected a finite number >= 0 (0 means greedy)")
        if not _is_int(self.top_k) or (self.top_k < 1 and self.top_k != -1) or self.top_k > INT32_MAX:
            raise bad("top_k", f"expected 0 or -1 (disabled) or an integer in [1, {INT32_MAX}] (int32)")
        number_in("top_p", 0.0, 1.0, "expected a number in (0, 1]", lo_open=True)
        number_in("min_p", 0.0, 1.0, "expected a number in [0, 1] (0 disables)")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= INT64_MAX):
            raise bad("seed", "expected None or an integer in [0, 2**63) (int64)")
        number_in("repetition_penalty", 0.0, FLOAT32_MAX, "expected a finite number > 0 (1 disables)", lo_open=True)
        number_in("frequency_penalty", -2.0, 2.0, "expected a number in [-2, 2] (0 disables)")
        number_in("presence_penalty", -2.0, 2.0, "expected a number in [-2, 2] (0 disables)")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= (self.max_tokens or math.inf):
            raise bad("min_tokens", f"expected an integer in [0, max_tokens={self.max_tokens}]")
        ids = list(self.stop_token_ids)
        if any(not _is_int(t) or not 0 <= t <= INT64_MAX for t in ids):
            raise bad("stop_token_ids", "expected a list of token ids in [0, 2**63) (the engine checks the "
                      "vocabulary at add time)")
        self.stop_token_ids = ids
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        stop = list(self.stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise bad("stop", "expected a string or a list of non-empty strings")
        self.stop = stop
        self._check_logit_bias(bad)
        if self.structured_outputs is not None:
            self.structured_outputs = StructuredOutputsParams.from_value(self.structured_outputs,
                                                                         "SamplingParams.structured_outputs")
        if self.extra_args is not None and (not isinstance(self.extra_args, dict)
                                            or any(not isinstance(k, str) for k in self.extra_args)):
            raise bad("extra_args", "expected None or a dict with string keys (per-request logits processor args)")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or v < 0):
                raise bad(name, "expected None or an integer >= 0 (bounded by EngineConfig.max_logprobs)")

    def _check_vllm_fields(self, bad) -> None:
        """max_tokens, top_k 0 and the fields vLLM has beyond the sampling maths."""
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1
        ):
            raise bad("max_tokens", "expected None (until max_model_len) or an integer >= 1")
        if self.top_k == 0 and not isinstance(self.top_k, bool):
            self.top_k = -1
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise bad("n", "expected an integer >= 1 (the number of samples per prompt)")
        for name in ("include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "expected True or False")
        if not self.spaces_between_special_tokens:
            raise bad("spaces_between_special_tokens", "only True is supported: the detokenizer decodes with the "
                      "tokenizer's own spacing")

    def _check_logit_bias(self, bad) -> None:
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, dict):
            raise bad("logit_bias", "expected None or a dict {token_id: bias}")
        bias = {}
        for k, v in self.logit_bias.items():
            tok = _token_id_key(k)
            if tok is None:
                raise bad("logit_bias", f"token id {k!r} is not an integer: expected int keys, or strings of "
                          "decimal digits such as \"42\" (JSON object keys)")
            if not 0 <= tok <= INT64_MAX:
                raise bad("logit_bias", f"token id {tok} is outside [0, 2**63) (the engine checks the vocabulary "
                          "at add time)")
            if tok in bias:
                raise bad("logit_bias", f"token id {tok} is given twice (keys {k!r} and another that reads as {tok})")
            if not _is_number(v) or not -100.0 <= v <= 100.0:
                raise bad("logit_bias", f"bias {v!r} of token {tok} is outside [-100, 100]")
            bias[tok] = float(v)
        self.logit_bias = bias or None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
