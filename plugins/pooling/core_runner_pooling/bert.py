"""BertModel (encoder only) from core_runner.layers: absolute position embeddings, token
type embeddings, post-LayerNorm blocks, GELU MLP, bidirectional attention.

Parameter names follow transformers' ``BertModel`` (``embeddings.word_embeddings``,
``encoder.layer.N.attention.self.query``, ...); query/key/value load into one fused
projection. The pooler (``pooler.dense``) is not used by mean / CLS / last pooling of the
final hidden states and its weights are skipped; so are the ``bert.`` prefix of
task-headed checkpoints and the ``embeddings.position_ids`` buffer.
``BertForSequenceClassification`` (cross-encoders, classifiers) keeps the pooler:
``classify(cls_state) = classifier(tanh(pooler.dense(cls_state)))`` (dropout is off at
inference); it honours ``token_type_ids`` (a sentence pair's second segment is type 1).

Tensor parallelism (vLLM's split): each rank keeps 1/tp of the attention heads
(``QKVParallelLinear``) and of the intermediate dimension (``ColumnParallelLinear``); the
two dense projections back to the hidden size are ``RowParallelLinear``, whose all-reduce
leaves the same full hidden states on every rank, so LayerNorms, residuals and pooling
run whole on each rank. Word embeddings are split over the vocabulary.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core_runner.layers import (
    Attention,
    ColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    default_weight_loader,
)
from core_runner.layers.gelu import gelu_from_name
from core_runner.layers.layernorm import LayerNorm


class ReplicatedEmbedding(nn.Module):
    """A lookup table held whole on every rank: ``forward(ids [T]) -> [T, embedding_dim]``.

    For BERT's position (512 rows) and token-type (2 rows) tables: splitting them over the
    rows would save at most a few MB per rank but cost an all-reduce per table per step,
    and a whole table also lets the single-segment path read row 0 directly."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim), requires_grad=False)
        self.weight.weight_loader = default_weight_loader

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids.long(), self.weight)


class BertEmbeddings(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        h = config.hidden_size
        self.word_embeddings = VocabParallelEmbedding(config.vocab_size, h)
        self.position_embeddings = ReplicatedEmbedding(config.max_position_embeddings, h)
        self.token_type_embeddings = ReplicatedEmbedding(config.type_vocab_size, h)
        self.LayerNorm = LayerNorm(h, config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: torch.Tensor | None) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        if token_type_ids is None:  # single-segment input: every token is type 0
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        h, heads = config.hidden_size, config.num_attention_heads
        if h % heads:
            raise ValueError(f"hidden_size={h} must be a multiple of num_attention_heads={heads}")
        self.head_dim = h // heads
        self.qkv_proj = QKVParallelLinear(h, self.head_dim, heads, heads, bias=True)
        # this rank's heads: q, k and v have as many (no grouped-query attention in BERT)
        local = self.qkv_proj.num_heads
        self.attn = Attention(local, local, self.head_dim, self.head_dim**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).chunk(3, dim=-1)
        return self.attn(q, k, v)


class BertDenseNorm(nn.Module):
    """dense -> (+ residual) -> LayerNorm: ``attention.output`` and ``output`` of a layer.
    ``dense`` takes the rank's slice of heads / intermediate features and all-reduces, so
    the residual add and LayerNorm see full hidden states."""

    def __init__(self, in_features: int, config: Any) -> None:
        super().__init__()
        self.dense = RowParallelLinear(in_features, config.hidden_size, bias=True)
        self.LayerNorm = LayerNorm(config.hidden_size, config.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x), residual)


class BertAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertDenseNorm(config.hidden_size, config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        # GELU is elementwise, so it runs on the rank's slice of features as it is
        self.dense = ColumnParallelLinear(config.hidden_size, config.intermediate_size, bias=True)
        self.act = gelu_from_name(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertDenseNorm(config.intermediate_size, config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(x)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x)
        return x


class BertModel(nn.Module):
    """forward(input_ids, positions, token_type_ids=None) -> final hidden states [T, hidden]."""

    is_causal = False
    default_pooling_type = "mean"  # sentence-transformers' default for a plain BERT
    packed_modules_mapping = {"query": ("qkv_proj", "q"), "key": ("qkv_proj", "k"), "value": ("qkv_proj", "v")}
    ignored_weight_patterns = (r"^pooler\.", r"^embeddings\.position_ids$")

    def __init__(self, config: Any) -> None:
        super().__init__()
        kind = getattr(config, "position_embedding_type", "absolute") or "absolute"
        if kind != "absolute":
            raise ValueError(f"position_embedding_type={kind!r} is not supported: only 'absolute' is implemented")
        if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
            raise ValueError("BertModel as a decoder (is_decoder / add_cross_attention) is not supported")
        self.hidden_size = int(config.hidden_size)
        self.max_position_embeddings = int(config.max_position_embeddings)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)

    @staticmethod
    def map_weight_name(name: str) -> str | None:
        """Accept checkpoints saved from a task-headed model (``bert.`` prefix); drop heads."""
        if name.startswith("bert."):
            return name[len("bert."):]
        if name.startswith(("cls.", "classifier.", "qa_outputs.")):
            return None
        return name

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder(self.embeddings(input_ids, positions, token_type_ids))


class BertPooler(nn.Module):
    """tanh(dense(x)) of the first token's state; whole on every rank (one [h, h] matrix)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = ReplicatedLinear(config.hidden_size, config.hidden_size, bias=True)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(first))


class BertForSequenceClassification(BertModel):
    """The encoder plus transformers' head: CLS state -> pooler -> classifier [num_labels].
    forward as BertModel's; ``classify(pooled [n, hidden]) -> logits [n, num_labels]``."""

    default_pooling_type = "cls"
    uses_token_type_ids = True
    ignored_weight_patterns = (r"^embeddings\.position_ids$",)

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.config = config
        self.num_labels = int(config.num_labels)
        self.pooler = BertPooler(config)
        # replicated: every rank holds the same full hidden states after the all-reduce
        self.classifier = ReplicatedLinear(config.hidden_size, self.num_labels, bias=True)

    @staticmethod
    def map_weight_name(name: str) -> str | None:
        if name.startswith("bert."):
            return name[len("bert."):]
        return None if name.startswith(("cls.", "qa_outputs.")) else name

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pooler(pooled))
