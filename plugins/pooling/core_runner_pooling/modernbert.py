"""ModernBERT encoders from core_runner.layers: ``ModernBertModel`` (embeddings) and
``ModernBertForSequenceClassification`` (classifiers, cross-encoders).

The architecture (transformers' ``modeling_modernbert``): token embeddings -> LayerNorm
(no position table), then pre-norm blocks ``x + attn(attn_norm(x))``, ``x + mlp(mlp_norm(x))``
(layer 0 has no attn_norm), and a final LayerNorm. Attention is bidirectional with RoPE;
``config.layer_types`` alternates "full_attention" layers (RoPE of
``rope_parameters["full_attention"]``, global_rope_theta in published configs) and
"sliding_attention" layers, which see keys with |k - q| <= local_attention // 2 (the
attention option ``bidirectional_window``) and rope with ``rope_parameters["sliding_attention"]``
(local_rope_theta). transformers builds layer_types from the published
``global_attn_every_n_layers`` (every n-th layer, from layer 0, is global). The MLP is GeGLU:
``Wo(act(input) * gate)`` with ``Wi`` producing [input | gate]. ``norm_bias``,
``mlp_bias`` and ``attention_bias`` drop the biases of norms, MLP and attention projections.

transformers unpads batches (flash attention) or pads them (SDPA / eager); here one
request is one sequence laid out flat, so padding and unpadding change nothing: no pad
token ever enters an attention row or a pooled mean.

Tensor parallelism as BERT's (bert.py): heads and intermediate features split across
ranks, ``Wo`` row-parallel (all-reduced), norms, residuals, the head and pooling whole on
every rank.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core_runner.layers import (
    Attention,
    LayerNorm,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    act_and_mul,
    gelu_from_name,
    get_rope,
)

LAYER_TYPES = ("full_attention", "sliding_attention")
CLASSIFIER_POOLING = ("cls", "mean")
# classifier_activation names served besides the GELUs of gelu_from_name (transformers' ACT2FN)
_PLAIN_ACTS = {"relu": F.relu, "silu": F.silu, "swish": F.silu, "tanh": torch.tanh}


def layer_types_of(config: Any) -> list[str]:
    """``config.layer_types`` (transformers 5 derives it from global_attn_every_n_layers),
    checked: one known kind per layer."""
    kinds = getattr(config, "layer_types", None)
    n = int(config.num_hidden_layers)
    if not isinstance(kinds, (list, tuple)) or len(kinds) != n or any(k not in LAYER_TYPES for k in kinds):
        raise ValueError(f"layer_types={kinds!r}: expected one of {list(LAYER_TYPES)} for each of the "
                         f"num_hidden_layers={n} layers")
    return list(kinds)


class _Activation(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def classifier_activation(name: str) -> nn.Module:
    """The head's (ungated) activation for ``classifier_activation``; refused by name otherwise."""
    if name in _PLAIN_ACTS:
        return _Activation(_PLAIN_ACTS[name])
    try:
        return gelu_from_name(name)
    except ValueError:
        raise ValueError(f"classifier_activation={name!r} is not supported: expected one of "
                         f"{sorted(_PLAIN_ACTS)} or a GELU (gelu, gelu_new, gelu_pytorch_tanh, gelu_fast)") from None


class ModernBertAttention(nn.Module):
    def __init__(self, config: Any, layer_type: str) -> None:
        super().__init__()
        h, heads = int(config.hidden_size), int(config.num_attention_heads)
        if h % heads:
            raise ValueError(f"hidden_size={h} must be a multiple of num_attention_heads={heads}")
        self.head_dim = h // heads
        bias = bool(config.attention_bias)
        self.Wqkv = QKVParallelLinear(h, self.head_dim, heads, heads, bias=bias)
        self.Wo = RowParallelLinear(h, h, bias=bias)
        self.num_heads = self.Wqkv.num_heads  # this rank's heads (no grouped-query attention)
        self.rotary_emb = get_rope(config, self.head_dim, layer_type=layer_type)
        window = None
        if layer_type == "sliding_attention":
            local = config.local_attention
            if isinstance(local, bool) or not isinstance(local, int) or local < 0:
                raise ValueError(f"local_attention={local!r}: expected an int >= 0")
            window = local // 2  # transformers' config.sliding_window: |k - q| <= local_attention // 2
        self.attn = Attention(self.num_heads, self.num_heads, self.head_dim, self.head_dim**-0.5,
                              bidirectional_window=window)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.Wqkv(x).chunk(3, dim=-1)
        q, k = self.rotary_emb(positions, q.reshape(-1, self.num_heads, self.head_dim),
                               k.reshape(-1, self.num_heads, self.head_dim))
        return self.Wo(self.attn(q, k, v))


class ModernBertMLP(nn.Module):
    """GeGLU (or the gated form of another ``hidden_activation``): Wo(act(input) * gate)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        h, inter, bias = int(config.hidden_size), int(config.intermediate_size), bool(config.mlp_bias)
        self.Wi = MergedColumnParallelLinear(h, [inter, inter], bias=bias)
        try:
            self.act = act_and_mul(config.hidden_activation)
        except ValueError as e:
            raise ValueError(f"hidden_activation={config.hidden_activation!r}: {e}") from None
        self.Wo = RowParallelLinear(inter, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.Wo(self.act(self.Wi(x)))


def _norm(config: Any) -> LayerNorm:
    return LayerNorm(int(config.hidden_size), float(config.norm_eps), bias=bool(config.norm_bias))


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, config: Any, layer_idx: int, layer_type: str) -> None:
        super().__init__()
        # transformers: layer 0's attention reads the (already normed) embeddings directly
        self.attn_norm = None if layer_idx == 0 else _norm(config)
        self.attn = ModernBertAttention(config, layer_type)
        self.mlp_norm = _norm(config)
        self.mlp = ModernBertMLP(config)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(positions, x if self.attn_norm is None else self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.tok_embeddings = VocabParallelEmbedding(int(config.vocab_size), int(config.hidden_size))
        self.norm = _norm(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))


class ModernBertModel(nn.Module):
    """forward(input_ids, positions) -> final hidden states [T, hidden].

    Default pooling (when the checkpoint has no sentence-transformers pooling config):
    ``config.classifier_pooling``, the pooling the checkpoint's own classifier head uses."""

    is_causal = False

    def __init__(self, config: Any) -> None:
        super().__init__()
        pooling = getattr(config, "classifier_pooling", "cls")
        if pooling not in CLASSIFIER_POOLING:
            raise ValueError(f"classifier_pooling={pooling!r} is not supported: expected one of "
                             f"{list(CLASSIFIER_POOLING)}")
        self.default_pooling_type = pooling
        self.hidden_size = int(config.hidden_size)
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, i, kind)
                                    for i, kind in enumerate(layer_types_of(config)))
        self.final_norm = _norm(config)

    @staticmethod
    def map_weight_name(name: str) -> str | None:
        """Accept checkpoints saved from a task-headed model (``model.`` prefix); drop heads
        (the masked-LM ``head`` / ``decoder``, a classifier's ``head`` / ``classifier``)."""
        if name.startswith("model."):
            return name[len("model."):]
        return None if name.startswith(("head.", "decoder.", "classifier.")) else name

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        # token types are not read: ModernBERT has no token-type embeddings
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x = layer(positions, x)
        return self.final_norm(x)


class ModernBertPredictionHead(nn.Module):
    """norm(act(dense(x))): whole on every rank (one [h, h] matrix)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        h = int(config.hidden_size)
        self.dense = ReplicatedLinear(h, h, bias=bool(config.classifier_bias))
        self.act = classifier_activation(config.classifier_activation)
        self.norm = _norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class ModernBertForSequenceClassification(ModernBertModel):
    """The encoder plus transformers' head: pooled state (``classifier_pooling``: the CLS
    token's or the mean over the prompt) -> head -> classifier [num_labels] (dropout is
    off at inference). ``classify(pooled [n, hidden]) -> logits [n, num_labels]``."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.config = config
        self.num_labels = int(config.num_labels)
        self.head = ModernBertPredictionHead(config)
        # transformers' classifier always has a bias (classifier_bias is the head's dense)
        self.classifier = ReplicatedLinear(self.hidden_size, self.num_labels, bias=True)

    @staticmethod
    def map_weight_name(name: str) -> str | None:
        if name.startswith("model."):
            return name[len("model."):]
        return None if name.startswith("decoder.") else name

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.head(pooled))
