"""Structured outputs: constrain generation to a JSON schema, regex, choice or grammar.

``StructuredOutputsParams`` (vLLM's name and fields) rides ``SamplingParams.structured_outputs``;
the grammar is compiled by xgrammar off the engine thread (``compiler.py``), advanced on the
host as tokens arrive (``matcher.py``) and applied in the sampler as a token bitmask
(``core_runner/sample/bitmask.py``). Design: docs/structured_outputs.md.
"""
from core_runner.structured_outputs.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
