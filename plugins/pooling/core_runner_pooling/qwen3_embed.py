"""Qwen3 last-token embedding (the Qwen3-Embedding recipe): the Qwen3 decoder stack of
core-runner-qwen3 without an LM head, causal attention, pooled at the last prompt token
and L2-normalised (PoolingParams' default).

Checkpoints saved from transformers' ``Qwen3Model`` name their tensors
``embed_tokens.weight``, ``layers.N....`` and ``norm.weight``; ones saved from a
``Qwen3ForCausalLM`` wrapper carry a ``model.`` prefix and an ``lm_head`` that is skipped.

``Qwen3ForSequenceClassification`` (the Qwen3-Reranker seq-cls conversion, reward-style
classifiers): the same stack, pooled at the last prompt token (transformers pools the
last non-padding token; prompts here carry no padding) and scored by ``score``, a
bias-free [num_labels, hidden] linear, whole on every rank.
"""
from __future__ import annotations

from typing import Any

import torch
from core_runner_qwen3.model import Qwen3ForCausalLM, Qwen3Model

from core_runner.layers import ReplicatedLinear


class Qwen3EmbeddingModel(Qwen3Model):
    """forward(input_ids, positions) -> final (normed) hidden states [T, hidden]."""

    is_causal = True
    default_pooling_type = "last"
    # Qwen3-Embedding is trained Matryoshka-style (its card: output dimensions 32 .. hidden),
    # and vLLM serves it so: PoolingParams.dimensions is accepted (model_states/pooling.py)
    is_matryoshka = True
    packed_modules_mapping = Qwen3ForCausalLM.packed_modules_mapping
    ignored_weight_patterns = (r"rotary_emb\.inv_freq", r"^lm_head\.weight$")

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.hidden_size = int(config.hidden_size)

    @staticmethod
    def map_weight_name(name: str) -> str | None:
        return name[len("model."):] if name.startswith("model.") else name


class Qwen3ForSequenceClassification(Qwen3EmbeddingModel):
    """forward as Qwen3EmbeddingModel's; ``classify(last [n, hidden]) -> logits [n, num_labels]``."""

    ignored_weight_patterns = (r"rotary_emb\.inv_freq",)
    is_matryoshka = False  # a classifier: its head reads the whole pooled state

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.config = config
        self.score = ReplicatedLinear(config.hidden_size, int(config.num_labels), bias=False)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.score(pooled)
