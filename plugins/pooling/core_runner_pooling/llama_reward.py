"""Llama reward models from core_runner.layers: Llama's decoder (GQA, RoPE with any of
transformers' scalings, pre-norm RMSNorm blocks, gated MLP; ``attention_bias`` /
``mlp_bias`` honoured), causal, no LM head.

``LlamaForSequenceClassification`` (published Llama-3.x reward models, ``num_labels=1``):
  ``score``, a bias-free [num_labels, hidden] linear, read at the last prompt token
  (transformers reads the last non-padding token; prompts here carry no padding).
  Served by RewardModelState: task ``reward`` (raw logits), also ``classify`` / ``score``.
``LlamaForTokenClassification`` (a per-token reward head): ``score`` ([num_labels, hidden],
  with a bias unless ``token_classification_bias`` is False) on every prompt token; its
  dropout is the identity at inference. Served by TokenRewardModelState.

Checkpoint names are transformers' (``model.layers.N....``, ``score.*``); q/k/v and
gate/up are packed into one parameter each. Under tensor parallelism the stack splits as
vLLM's Llama (column-parallel q/k/v and gate/up, row-parallel o and down); ``score`` is
whole on every rank.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core_runner.layers import (
    DecoderAttention,
    DecoderStack,
    GatedMLP,
    PreNormDecoderLayer,
    ReplicatedLinear,
)


def llama_layer(config: Any, layer_idx: int) -> PreNormDecoderLayer:
    """Llama's pre-norm layer (``attention_bias`` read by DecoderAttention, ``mlp_bias`` here)."""
    mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                   bias=bool(getattr(config, "mlp_bias", False)))
    return PreNormDecoderLayer(DecoderAttention(config), mlp, config.hidden_size, config.rms_norm_eps)


class LlamaForSequenceClassification(nn.Module):
    """``forward(input_ids, positions) -> hidden [T, hidden]``; ``classify(h [n, hidden]) -> [n, num_labels]``."""

    is_causal = True
    default_pooling_type = "last"
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }
    # a reward checkpoint converted from a causal LM may still carry its LM head
    ignored_weight_patterns = (r"rotary_emb\.inv_freq", r"^lm_head\.weight$")

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.hidden_size = int(config.hidden_size)
        self.model = DecoderStack(config, llama_layer)
        self.score = ReplicatedLinear(config.hidden_size, int(config.num_labels), bias=self.score_bias(config))

    @staticmethod
    def score_bias(config: Any) -> bool:
        return False  # transformers' sequence classifiers score without a bias

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.score(pooled)


class LlamaForTokenClassification(LlamaForSequenceClassification):
    """The same stack; ``classify`` scores every prompt token (``default_pooling_type = "all"``)."""

    default_pooling_type = "all"

    @staticmethod
    def score_bias(config: Any) -> bool:
        return bool(getattr(config, "token_classification_bias", True))
