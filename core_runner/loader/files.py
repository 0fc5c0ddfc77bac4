"""What every loader module shares: the error type and reading a checkpoint's JSON files."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint the engine refuses to load; the message names the file (and tensor)
    at fault and what would be valid."""


def read_json(file: str | Path, what: str = "a JSON object") -> dict[str, Any]:
    """``file`` parsed as a JSON object; invalid JSON or another top-level type is a
    CheckpointError naming the file and the position of the problem."""
    file = Path(file)
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{file}: not UTF-8 text ({e}); expected {what}") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"{file}: invalid JSON at line {e.lineno} column {e.colno} ({e.msg}); expected {what} "
            "(a truncated download? fetch the file again)"
        ) from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: the top level is a {type(data).__name__}, expected {what}")
    return data
