"""The error of an engine that cannot take another step."""
from __future__ import annotations


class EngineDeadError(RuntimeError):
    """A tensor-parallel rank failed or died: the ranks' collectives can no longer be
    matched, so the engine stops (its requests finish with ``finish_reason="error"``) and
    every later call raises this error again. Build a new engine to continue."""
