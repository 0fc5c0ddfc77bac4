"""Splitting streamed text at markers such as ``<think>`` or ``<tool_call>``.

A marker may arrive cut over two deltas; ``safe_prefix`` says how much of a buffer can be
sent on now because no suffix of it can be the start of the marker.
"""
from __future__ import annotations


def safe_prefix(buffer: str, marker: str) -> int:
    """The length of ``buffer``'s longest prefix after which no text could still complete
    ``marker`` (the tail that is a proper prefix of the marker is held back)."""
    for k in range(min(len(marker) - 1, len(buffer)), 0, -1):
        if marker.startswith(buffer[-k:]):
            return len(buffer) - k
    return len(buffer)
