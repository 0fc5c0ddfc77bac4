"""Qwen3 last-token embedding (the Qwen3-Embedding recipe): the Qwen3 decoder stack of
core-runner-qwen3 without an LM head, causal attention, pooled at the last prompt token
and L2-normalised (PoolingParams' default).

Checkpoints saved from transformers' ``Qwen3Model`` name their tensors
``embed_tokens.weight``, ``layers.N....`` and ``norm.weight``; ones saved from a
``Qwen3ForCausalLM`` wrapper carry a ``model.`` prefix and an ``lm_head`` that is skipped.
"""
from __future__ import annotations

from typing import Any

from core_runner_qwen3.model import Qwen3ForCausalLM, Qwen3Model


class Qwen3EmbeddingModel(Qwen3Model):
    """forward(input_ids, positions) -> final (normed) hidden states [T, hidden]."""

    is_causal = True
    default_pooling_type = "last"
    packed_modules_mapping = Qwen3ForCausalLM.packed_modules_mapping
    ignored_weight_patterns = (r"rotary_emb\.inv_freq", r"^lm_head\.weight$")

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.hidden_size = int(config.hidden_size)

    @staticmethod
    def map_weight_name(name: str) -> str | None:
        return name[len("model."):] if name.startswith("model.") else name
