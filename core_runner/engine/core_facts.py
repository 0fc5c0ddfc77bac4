"""What the API process knows of an engine that runs in the engine-core process.

The handlers read a few facts from ``llm.engine`` (the tokenizer, the tasks, the config's
model and max_model_len, the checkpoint config, the sampling defaults, the
InputProcessor). ``CoreFacts`` holds them, built from the core's ``EngineCoreReady``
message: the tokenizer is loaded from the directory the core resolved, and the
InputProcessor is built from the same facts ``LLMEngine`` builds it from, so prompts are
tokenized and validated in the API process exactly as in-process, without the weights.
The one thing it cannot do here is the model's pooling defaults (a method of the loaded
model's state): the core resolves them when the request arrives and refuses it there.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from core_runner.engine.defaults import GenerationDefaults
from core_runner.engine.input_processor import InputProcessor
from core_runner.loader import load_tokenizer
from core_runner.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServedConfig:
    """The resolved EngineConfig values the API process reads (the InputProcessor and the handlers)."""

    model: str
    max_model_len: int
    max_logprobs: int
    seed: int


class CoreFacts:
    """``llm.engine`` of an ``AsyncMPClient`` (see the module docstring)."""

    def __init__(self, ready: Any) -> None:
        self.config = ServedConfig(ready.model, ready.max_model_len, ready.max_logprobs, ready.seed)
        self.model_path = ready.model_path
        self.architecture = ready.architecture
        self.tasks = tuple(ready.tasks)
        self.core_pid = ready.pid
        self.tokenizer = load_tokenizer(ready.tokenizer_path) if ready.tokenizer_path is not None else None
        self.hf_config = _config(ready.hf_config_json)
        self.generation_defaults = GenerationDefaults(tuple(ready.eos_token_ids), dict(ready.sampling_defaults))
        self.input_processor = InputProcessor(
            self.config, architecture=ready.architecture, tasks=self.tasks, tokenizer=self.tokenizer,
            vocab_size=ready.vocab_size, eos_token_ids=tuple(ready.eos_token_ids), max_positions=ready.max_positions,
            chunked_prefill=ready.chunked_prefill, resolve_pooling=None,
        )

    def default_sampling_params(self) -> SamplingParams:
        return self.generation_defaults.sampling_params()

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.input_processor.eos_token_ids


def _config(text: str) -> Any:
    """The checkpoint's config.json as the core read it, as a transformers PretrainedConfig
    (label maps keyed by int, as the core has them)."""
    from transformers import PretrainedConfig

    fields = json.loads(text)
    for key in ("transformers_version", "model_type"):  # read-only or class-level in PretrainedConfig
        fields.pop(key, None)
    try:
        return PretrainedConfig(**fields)
    except (TypeError, ValueError) as e:  # never fatal: only labels are read from it
        logger.warning("the checkpoint config sent by the engine core could not be rebuilt (%s)", e)
        return PretrainedConfig()
