"""Token embedding and LM head, split over the vocabulary across tensor-parallel ranks.

Each rank holds a contiguous block of ``ceil(vocab / tp)`` rows (the last block is
padded with zero rows). The embedding looks up the ids of its block, zeros the others
and all-reduces; the LM head computes its block of logits and all-gathers them, trimmed
to the vocabulary, so every rank gets the full [T, vocab] logits (each rank samples the
same token from them). With one rank both are plain lookups / products.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core_runner.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from core_runner.layers.fp8_weight import SCALE, _fp8_linear, _make_fp8_resident, is_fp8
from core_runner.layers.fp8_weight import _load_rows as _load_fp8_rows
from core_runner.layers.linear import copy_into


class VocabParallelEmbedding(nn.Module):
    """Token embedding: ``forward(input_ids [T]) -> [T, embedding_dim]``. ``weight`` is this
    rank's rows [rank * n, (rank + 1) * n) of the checkpoint's [num_embeddings,
    embedding_dim] matrix (n = ceil(num_embeddings / tp))."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_size, self.tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.rows_per_partition = -(-num_embeddings // self.tp_size)
        self.start = self.tp_rank * self.rows_per_partition
        self.end = min(self.start + self.rows_per_partition, num_embeddings)
        self.weight = nn.Parameter(torch.empty(self.rows_per_partition, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        if shard_id is not None:
            raise ValueError(f"parameter of shape {tuple(param.shape)} is not fused; got shard {shard_id!r}")
        if tuple(loaded.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"checkpoint tensor has shape {tuple(loaded.shape)}, expected "
                             f"{(self.num_embeddings, self.embedding_dim)}")
        mine = self.end - self.start
        if mine < param.shape[0]:
            param.data[mine:].zero_()
        if mine > 0:
            self._load_rows(param, loaded.narrow(0, self.start, mine) if self.tp_size > 1 else loaded, mine)

    def _load_rows(self, param: nn.Parameter, loaded, mine: int) -> None:
        copy_into(param.data[:mine], loaded)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.long()
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        inside = (ids >= self.start) & (ids < self.end)
        out = F.embedding(torch.where(inside, ids - self.start, 0), self.weight)
        out = out * inside.unsqueeze(-1).to(out.dtype)
        return tensor_model_parallel_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states [T, embedding_dim] to logits [T, num_embeddings], every rank
    getting all of them; its weight is split as the embedding's, or is the embedding's
    own (``tied_to``).

    Built for a quantized checkpoint, an untied head keeps fp8 weights resident as the linear
    layers do (``layers.fp8_weight``: the W8A8 kernel under Triton, dequantized per call
    otherwise) when the checkpoint quantizes ``lm_head``; the published fp8 checkpoints leave
    it unquantized, and an unquantized tensor (or a rank's rows that do not start on a scale
    block) turns the head dense at load."""

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 tied_to: VocabParallelEmbedding | None = None) -> None:
        super().__init__(num_embeddings, embedding_dim)
        if tied_to is not None:
            self.weight = tied_to.weight
        elif _make_fp8_resident(self, self.weight):
            # the last rank's padding rows hold zeros: a finite scale keeps their logits 0
            getattr(self, SCALE).fill_(1.0)

    def _load_rows(self, param: nn.Parameter, loaded, mine: int) -> None:
        if param is self.weight and is_fp8(self):
            return _load_fp8_rows(self, param, 0, mine, loaded, "lm_head")
        return super()._load_rows(param, loaded, mine)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = _fp8_linear(self, hidden, None) if is_fp8(self) else F.linear(hidden, self.weight)
        if self.tp_size == 1:
            return logits
        return tensor_model_parallel_all_gather(logits, dim=-1)[..., : self.num_embeddings]


# the names plugins used before the vocabulary was split across ranks
VocabEmbedding = VocabParallelEmbedding
LMHead = ParallelLMHead
