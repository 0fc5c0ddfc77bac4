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
    Attention,
    GatedMLP,
    QKVParallelLinear,
    ReplicatedLinear,
    RMSNorm,
    RowParallelLinear,
    VocabParallelEmbedding,
    check_head_split,
    get_rope,
)


class LlamaAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        check_head_split(heads, kv_heads)
        self.head_dim = getattr(config, "head_dim", None) or hidden // heads
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, heads, kv_heads, bias=bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(heads * self.head_dim, hidden, bias=bias)
        self.rotary_emb = get_rope(config, self.head_dim)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5)
        kv = self.num_kv_heads * self.head_dim
        self.split = [self.num_heads * self.head_dim, kv, kv]

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q, k = self.rotary_emb(positions, q.reshape(-1, self.num_heads, self.head_dim),
                               k.reshape(-1, self.num_kv_heads, self.head_dim))
        return self.o_proj(self.attn(q, k, v))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                            bias=bool(getattr(config, "mlp_bias", False)))
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        return self.norm(x, residual)[0]


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
        self.model = LlamaModel(config)
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
