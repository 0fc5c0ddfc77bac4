"""XLM-RoBERTa encoders from BERT's blocks: ``XLMRobertaModel`` (BGE-M3 shape: CLS pooling,
L2-normalised) and ``XLMRobertaForSequenceClassification`` (bge-reranker shape).

The encoder is BERT's (bert.py) with two differences, both in the embeddings' inputs:
positions start at ``padding_idx + 1`` (transformers' ``create_position_ids_from_input_ids``:
``padding_idx + cumsum(ids != pad)`` on non-pad tokens, ``padding_idx`` on pad tokens,
counted per prompt), and a single token type (``type_vocab_size == 1``: every token type 0).
Checkpoints name tensors as transformers' ``XLMRobertaModel`` (``roberta.`` prefix in
task-headed ones). The classifier head is RoBERTa's: ``out_proj(tanh(dense(cls_state)))``
(no BERT pooler; dropout is off at inference), whole on every rank.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core_runner.layers import ReplicatedLinear
from core_runner_pooling.bert import BertModel


def roberta_positions(input_ids: torch.Tensor, positions: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """transformers' XLM-R position ids for the flat tokens of whole prompts (``positions``
    restart at 0 at each prompt's first token: bidirectional prompts always run whole)."""
    keep = (input_ids != padding_idx).long()
    count = keep.cumsum(0)
    idx = torch.arange(positions.shape[0], device=positions.device)
    start = torch.where(positions == 0, idx, torch.zeros_like(idx)).cummax(0).values  # the prompt's first token
    before = count[start] - keep[start]  # non-pad tokens of earlier prompts
    return (count - before) * keep + padding_idx


class XLMRobertaModel(BertModel):
    """forward(input_ids, positions) -> final hidden states [T, hidden]."""

    default_pooling_type = "cls"  # BGE-M3's (its sentence-transformers config says so too)
    ignored_weight_patterns = (r"^pooler\.", r"^embeddings\.position_ids$", r"^embeddings\.token_type_ids$")

    @classmethod
    def max_positions_of(cls, config) -> int:
        """Tokens it can place: positions run from padding_idx + 1 to max_position_embeddings - 1."""
        return int(config.max_position_embeddings) - int(config.pad_token_id) - 1

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.padding_idx = int(config.pad_token_id)

    @staticmethod
    def map_weight_name(name: str) -> str | None:
        if name.startswith("roberta."):
            return name[len("roberta."):]
        return None if name.startswith(("lm_head.", "classifier.", "qa_outputs.")) else name

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        # token types are not read: XLM-R has one type (row 0, what BertEmbeddings adds for None)
        return super().forward(input_ids, roberta_positions(input_ids, positions, self.padding_idx))


class RobertaClassificationHead(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = ReplicatedLinear(config.hidden_size, config.hidden_size, bias=True)
        self.out_proj = ReplicatedLinear(config.hidden_size, int(config.num_labels), bias=True)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(first)))


class XLMRobertaForSequenceClassification(XLMRobertaModel):
    """forward as XLMRobertaModel's; ``classify(cls_state [n, hidden]) -> logits [n, num_labels]``."""

    ignored_weight_patterns = (r"^embeddings\.position_ids$", r"^embeddings\.token_type_ids$")

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.config = config
        self.num_labels = int(config.num_labels)
        self.classifier = RobertaClassificationHead(config)

    @staticmethod
    def map_weight_name(name: str) -> str | None:
        if name.startswith("roberta."):
            return name[len("roberta."):]
        return None if name.startswith(("lm_head.", "qa_outputs.")) else name

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(pooled)
