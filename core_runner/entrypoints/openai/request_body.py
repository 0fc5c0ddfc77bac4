"""A request body as a JSON object, or a 400/413 saying what is wrong with it.

Checked before any field is read: the size (``max_bytes``, also while it streams in),
valid JSON, nesting at most ``MAX_JSON_DEPTH`` arrays/objects deep (Python's json module
raises RecursionError near 1,000 levels; the limit is far below that and far above any
real request), and every string valid Unicode: JSON may escape a lone surrogate
(``"\\ud800"``), which no tokenizer or UTF-8 encoder takes, so it is refused here with the
path of the string (``messages[0].content``).
"""
from __future__ import annotations

import json
import re
from typing import Any

from fastapi import Request

from core_runner.entrypoints.openai.protocol import APIError

MAX_JSON_DEPTH = 64

# a JSON escape of a UTF-16 surrogate; a pair decodes to one character, a lone one stays
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


async def read_json(request: Request, max_bytes: int) -> dict:
    too_big = APIError(f"the request body is larger than the server's limit of {max_bytes} bytes", None, 413,
                       code="request_too_large")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise too_big
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > max_bytes:
            raise too_big
    try:
        body = json.loads(raw)
    except RecursionError:
        raise _too_deep(None) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise APIError(f"the request body must be a JSON object, got {type(body).__name__}")
    # a body with few brackets cannot nest deeply, one without a surrogate escape has no
    # lone surrogate: most bodies are not walked
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH or _SURROGATE_ESCAPE.search(raw):
        check_structure(body)
    return body


def check_structure(body: Any) -> None:
    """APIError for nesting deeper than MAX_JSON_DEPTH or a string (or key) that is not
    valid Unicode, naming its path."""
    stack: list[tuple[Any, tuple, int]] = [(body, (), 1)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(path)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            if type(k) is str:
                _check_text(k, path, f" (a key of {json_path(path) or 'the body'})")
            if type(v) is str:
                _check_text(v, path + (k,), "")
            elif type(v) is list or type(v) is dict:
                stack.append((v, path + (k,), depth + 1))


def json_path(path: tuple) -> str:
    """``("messages", 0, "content")`` -> ``messages[0].content``."""
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def _check_text(s: str, path: tuple, what: str) -> None:
    if s.isascii():
        return
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        where = json_path(path) or "the body"
        raise APIError(f"{where}{what} is not valid Unicode: character {e.start} is a lone surrogate "
                       f"(U+{ord(s[e.start]):04X}); send UTF-8 text (a character outside the BMP as a "
                       "surrogate pair)", json_path(path) or None) from None


def _too_deep(path: tuple | None) -> APIError:
    where = f" (at {json_path(path)})" if path else ""
    return APIError(f"the request body nests arrays/objects more than {MAX_JSON_DEPTH} levels deep{where}: "
                    f"at most {MAX_JSON_DEPTH} levels are accepted", json_path(path[:1]) if path else None)
