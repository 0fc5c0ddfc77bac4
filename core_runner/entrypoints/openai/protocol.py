"""OpenAI request bodies -> engine parameters, and OpenAI's error body.

Bodies are plain JSON objects checked field by field (not pydantic models) so that every
error names the OpenAI field that is wrong and says what would be valid. Which fields a route
knows, refuses or logs as ignored is ``fields.py``.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from core_runner.pooling_params import PoolingParams
from core_runner.sampling_params import SamplingParams


class APIError(Exception):
    """An error answered with OpenAI's body: {"error": {message, type, param, code}}."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = message, param, status, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# OpenAI (or vLLM extension) name -> SamplingParams field, for plain numbers
_FLOATS = {"temperature": "temperature", "top_p": "top_p", "min_p": "min_p",
           "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
           "repetition_penalty": "repetition_penalty"}
_INTS = {"top_k": "top_k", "seed": "seed", "min_tokens": "min_tokens"}
# refused rather than silently ignored: the client would get something other than it asked for
_UNSUPPORTED = {"best_of": (None, 1), "echo": (None, False), "suffix": (None, "")}
_SP_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_unsupported(body: dict, names: tuple[str, ...]) -> None:
    for name in names:
        if name in body and body[name] not in _UNSUPPORTED[name]:
            raise APIError(f"{name}={body[name]!r} is not supported by this server (leave it out)", name)


# choices per prompt a request may ask for (each is a request of its own in the engine)
MAX_N = 128


def sampling_params(body: dict, base: SamplingParams, *, chat: bool) -> tuple[SamplingParams, bool]:
    """SamplingParams for a completions (``chat=False``) or chat body, starting from the
    model's defaults ``base``; also whether max_tokens was given (chat fills the rest of
    the context when it is not)."""
    fields: dict[str, Any] = {}
    for name, target in _FLOATS.items():
        v = body.get(name)
        if v is not None:
            if not _is_num(v):
                raise APIError(f"{name} must be a number, got {v!r}", name)
            fields[target] = float(v)
    for name, target in _INTS.items():
        v = body.get(name)
        if v is not None:
            if not _is_int(v):
                raise APIError(f"{name} must be an integer, got {v!r}", name)
            fields[target] = v
    n = body.get("n")
    if n is not None:
        if not _is_int(n) or not 1 <= n <= MAX_N:
            raise APIError(f"n must be an integer in [1, {MAX_N}], got {n!r}", "n")
        fields["n"] = n
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    given = False
    for name in names:
        v = body.get(name)
        if v is not None:
            if not _is_int(v) or v < 1:
                raise APIError(f"{name} must be a positive integer, got {v!r}", name)
            fields["max_tokens"], given = v, True
            break
    if not chat and not given:
        fields["max_tokens"], given = 16, True  # OpenAI's default for completions
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise APIError(f"stop must be a non-empty string or a list of them, got {stop!r}", "stop")
        fields["stop"] = stop
    ids = body.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
            raise APIError(f"stop_token_ids must be a list of integers, got {ids!r}", "stop_token_ids")
        fields["stop_token_ids"] = ids
    for flag in ("ignore_eos", "include_stop_str_in_output"):
        if body.get(flag) is not None:
            if not isinstance(body[flag], bool):
                raise APIError(f"{flag} must be true or false, got {body[flag]!r}", flag)
            fields[flag] = body[flag]
    bias = body.get("logit_bias")
    if bias is not None:
        fields["logit_bias"] = _logit_bias(bias)
    fields.update(_logprobs(body, chat))
    try:
        return dataclasses.replace(base, **fields), given
    except (ValueError, TypeError) as e:
        raise APIError(str(e), _param_in(str(e), body)) from e


# a token id as OpenAI writes it: ASCII digits only (int() would also take " 7 ", "1_0", "٣")
_TOKEN_ID = re.compile(r"[0-9]{1,19}")


def _logit_bias(bias: Any) -> dict[int, float]:
    if not isinstance(bias, dict):
        raise APIError(f"logit_bias must be an object mapping token ids (as strings) to numbers, got {_short(bias)}",
                       "logit_bias")
    out = {}
    for k, v in bias.items():
        if not _TOKEN_ID.fullmatch(k):
            raise APIError(f"logit_bias key {_short(k)} is not a token id: expected a decimal integer >= 0 "
                           "written with the digits 0-9 only, e.g. \"1234\"", "logit_bias")
        tok = int(k)
        if not _is_num(v):
            raise APIError(f"logit_bias[{k!r}] must be a number, got {v!r}", "logit_bias")
        out[tok] = float(v)
    return out


def _logprobs(body: dict, chat: bool) -> dict[str, Any]:
    lp = body.get("logprobs")
    if chat:
        top = body.get("top_logprobs")
        if lp is not None and not isinstance(lp, bool):
            raise APIError(f"logprobs must be true or false for chat, got {lp!r}", "logprobs")
        if top is not None:
            if not _is_int(top) or top < 0:
                raise APIError(f"top_logprobs must be an integer >= 0, got {top!r}", "top_logprobs")
            if not lp:
                raise APIError("top_logprobs needs logprobs=true", "top_logprobs")
        return {"logprobs": top or 0} if lp else {}
    if lp is None:
        return {}
    if not _is_int(lp) or lp < 0:
        raise APIError(f"logprobs must be an integer >= 0 for completions, got {lp!r}", "logprobs")
    return {"logprobs": lp}


def _param_in(message: str, body: dict) -> str | None:
    """The request field an engine validation message is about: the first field named in
    it as a whole word (a field of the body before any other SamplingParams field)."""
    found = [(m.start(), name not in body, name) for name in _SP_FIELDS | set(body)
             if isinstance(name, str) and (m := re.search(rf"\b{re.escape(name)}\b", message))]
    return min(found)[2] if found else None


def engine_error(message: str, body: dict, prompt_param: str, index: int | None = None) -> APIError:
    """The 400 for an engine-side refusal (``InputProcessor.process``) of a request built
    from ``body``, labelled with the request field at fault: the message names a
    ``SamplingParams.<field>`` (said as the body's field) or else the prompt
    (``prompt_param``: prompt, messages or input; ``index``: which one of a list)."""
    m = re.match(r"SamplingParams\.(\w+)", message)
    if m is not None:
        field = m.group(1)
        # the body's name for the field (chat asks for logprobs as top_logprobs)
        names = {"logprobs": ("top_logprobs", "logprobs"), "max_tokens": ("max_completion_tokens", "max_tokens")}
        param = next((n for n in names.get(field, (field,)) if n in body), field)
        return APIError(param + message[m.end():], param)
    param = _param_in(message, body)
    if param is not None and "prompt" not in message:
        return APIError(message, param)
    where = prompt_param if index is None else f"{prompt_param}[{index}]"
    return APIError(message if where == "prompt" else f"{where}: {message}", prompt_param)


def completion_prompts(body: dict) -> list[str | list[int]]:
    """``prompt``: a string, a list of strings, a list of token ids, or a list of those lists."""
    p = body.get("prompt")
    bad = APIError(f"prompt must be a string, a list of strings, a list of token ids or a list of token-id "
                   f"lists, got {_short(p)}", "prompt")
    if isinstance(p, str):
        return [p]
    if not isinstance(p, list) or not p:
        raise bad
    if all(_is_int(t) for t in p):
        return [p]
    if all(isinstance(x, str) or (isinstance(x, list) and x and all(_is_int(t) for t in x)) for x in p):
        return list(p)
    raise bad


def embedding_inputs(body: dict) -> list[str | list[int]]:
    try:
        return completion_prompts({"prompt": body.get("input")})
    except APIError as e:
        raise APIError(e.message.replace("prompt", "input", 1), "input") from None


ENCODING_FORMATS = ("float", "base64")


def encoding_format(body: dict) -> str:
    """"float" (a list of numbers) or "base64" (little-endian float32 bytes, base64-encoded:
    what the openai client asks for by default)."""
    fmt = body.get("encoding_format")
    if fmt is None:
        return "float"
    if fmt not in ENCODING_FORMATS:
        valid = ", ".join(map(repr, ENCODING_FORMATS))
        raise APIError(f"encoding_format={_short(fmt)} is not supported; valid: {valid}", "encoding_format")
    return fmt


def pooling_params(body: dict) -> PoolingParams:
    """``truncate_prompt_tokens`` and ``dimensions`` (Matryoshka; the engine refuses it, a
    400 naming it, for a model that does not declare it)."""
    for name in ("truncate_prompt_tokens", "dimensions"):
        value = body.get(name)
        if value is not None and not _is_int(value):
            raise APIError(f"{name} must be an integer, got {_short(value)}", name)
    try:
        return PoolingParams(truncate_prompt_tokens=body.get("truncate_prompt_tokens"),
                             dimensions=body.get("dimensions"))
    except (ValueError, TypeError) as e:
        raise APIError(str(e), "dimensions" if "dimensions" in str(e) else "truncate_prompt_tokens") from e


def chat_messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(f"messages must be a non-empty list of {{role, content}} objects, got {_short(msgs)}",
                       "messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(f"messages[{i}] must be an object with a string role, got {_short(m)}", "messages")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI's content parts: text only
            texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                raise APIError(f"messages[{i}].content: only text parts are supported", "messages")
            msgs[i] = {**m, "content": "".join(texts)}
        elif content is not None and not isinstance(content, str):
            raise APIError(f"messages[{i}].content must be a string or a list of text parts, got {_short(content)}",
                           "messages")
    return msgs


def stream_options(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise APIError(f"stream must be true or false, got {stream!r}", "stream")
    opts = body.get("stream_options")
    if opts is None:
        return bool(stream), False
    if not stream:
        raise APIError("stream_options needs stream=true", "stream_options")
    if not isinstance(opts, dict):
        raise APIError(f"stream_options must be an object, got {opts!r}", "stream_options")
    return True, bool(opts.get("include_usage", False))


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."
