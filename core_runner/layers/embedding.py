from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core_runner.layers.linear import default_weight_loader


class VocabEmbedding(nn.Module):
    """Token embedding: ``forward(input_ids [T]) -> weight[input_ids]`` ([T, hidden_size]).
    ``weight`` is [vocab_size, hidden_size], loaded as the checkpoint's ``embed_tokens``."""
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids.long(), self.weight)


class LMHead(nn.Module):
    """Projects hidden states to vocabulary logits; may share the embedding matrix."""

    def __init__(self, vocab_size: int, hidden_size: int, tied_to: VocabEmbedding | None = None) -> None:
        super().__init__()
        if tied_to is not None:
            self.weight = tied_to.weight
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
            self.weight.weight_loader = default_weight_loader

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)
