"""A decoder ``model`` with its LM head: the outer module of a causal LM, as the Hugging
Face checkpoints name it (``model.*``, ``lm_head.weight``).

``tie_word_embeddings`` makes the LM head read the embedding's matrix; checkpoints of
tied models may still store it under ``lm_head.weight``, which is then skipped. The
loader's hooks default to the common layout (q/k/v packed into ``qkv_proj``, gate/up
into ``gate_up_proj``, rotary caches skipped); a family overrides the class attributes
or sets them on the instance. Under tensor parallelism the head splits the vocabulary
and gathers the logits.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core_runner.layers.embedding import ParallelLMHead

QKV_GATE_UP_PACKED: dict[str, tuple[str, Any]] = {
    "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}


class CausalLM(nn.Module):
    """``forward(input_ids, positions)`` returns what ``model`` returns (hidden [T, hidden],
    or (hidden, aux) for a DecoderStack with aux layers); ``compute_logits(hidden)`` the LM
    head's [T, vocab]. ``model`` needs an ``embed_tokens`` when the head is tied;
    ``tie_default`` is the tie when the config does not say (Gemma ties by default)."""

    packed_modules_mapping: dict[str, tuple[str, Any]] = QKV_GATE_UP_PACKED
    ignored_weight_patterns: tuple[str, ...] = (r"rotary_emb\.inv_freq",)

    def __init__(self, config: Any, model: nn.Module, *, tie_default: bool = False) -> None:
        super().__init__()
        self.model = model
        tied = bool(getattr(config, "tie_word_embeddings", tie_default))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, model.embed_tokens if tied else None)
        if tied:  # the shared matrix may also be stored under lm_head
            self.ignored_weight_patterns = (*self.ignored_weight_patterns, r"^lm_head\.weight$")

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
