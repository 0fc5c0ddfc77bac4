"""The logits-processor plugin contract, in the shape of vLLM's V1 interface.

A processor is built once per engine as ``cls(config, device, is_pin_memory)`` (``config`` is
the ``EngineConfig``; vLLM passes its VllmConfig) and sees the batch as rows of the logits
tensor: ``update_state(batch_update)`` before each sampling step says which rows were added
(``(index, SamplingParams, prompt_tok_ids, output_tok_ids)``; the output list grows in place as
tokens arrive), removed (indices) or moved; ``apply(logits)`` returns the edited [rows, vocab]
logits on the device. Per-request arguments come through ``SamplingParams.extra_args``.
``is_argmax_invariant()`` True says the processor never changes which token is the largest
(greedy rows could skip it: core-runner applies it to every row anyway, which is always correct).

Installed by entry point (group ``core_runner.logits_processors``, value ``module:Class``) or
passed as ``LLM(logits_processors=[Class or "module:Class"])``. Docs: docs/logits_processors.md.
"""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from core_runner.sampling_params import SamplingParams

ENTRY_POINT_GROUP = "core_runner.logits_processors"


class MoveDirectionality(enum.Enum):
    UNIDIRECTIONAL = 0  # a -> b, a is empty afterwards
    SWAP = 1  # a <-> b


AddedRequest = tuple[int, SamplingParams, list[int], list[int]]


@dataclass(slots=True)
class BatchUpdate:
    """Changes to the batch's rows since the last step; apply ``removed``, then ``added``, then ``moved``.
    core-runner sends a row whose request changed position as removed + added (never moved)."""

    batch_size: int
    removed: list[int] = field(default_factory=list)
    added: list[AddedRequest] = field(default_factory=list)
    moved: list[tuple[int, int, MoveDirectionality]] = field(default_factory=list)


class LogitsProcessor(ABC):
    """Base class of a logits processor plugin (vLLM's ``LogitsProcessor`` methods).

    ``supports_cuda_graphs``: the sampler runs after the forward (captured or not), eagerly, so
    every processor runs under CUDA graphs; the attribute is read for processors that want the
    step's forward to be eager too (False: such steps run eagerly, named in the log once)."""

    supports_cuda_graphs: ClassVar[bool] = True

    @abstractmethod
    def __init__(self, config: Any, device: torch.device, is_pin_memory: bool) -> None: ...

    @abstractmethod
    def is_argmax_invariant(self) -> bool: ...

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None: ...

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor: ...


def resolve_processor(spec: Any) -> type:
    """A processor class from a class or a "module:Class" string; anything else is refused by name."""
    if isinstance(spec, str):
        import importlib

        mod, _, attr = spec.partition(":")
        if not mod or not attr:
            raise ValueError(f"logits processor {spec!r}: expected 'module:Class'")
        try:
            spec = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"logits processor {spec!r} cannot be imported: {e}") from e
    if not isinstance(spec, type) or not issubclass(spec, LogitsProcessor):
        raise ValueError(f"logits processor {spec!r} is not a subclass of core_runner.sdk.LogitsProcessor")
    return spec


def installed_processors() -> list[type]:
    """Every processor registered under the entry-point group (a broken one fails loudly, by name)."""
    from importlib.metadata import entry_points

    out = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            out.append(resolve_processor(ep.load()))
        except Exception as e:
            raise ValueError(f"logits processor entry point {ep.name!r} ({ep.value}) failed to load: {e}") from e
    return out
