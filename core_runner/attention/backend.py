"""The attention backend interface and the metadata every backend reads."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(slots=True)
class AttnMetadata:
    """Per-step attention inputs, one entry per scheduled request (decode rows first).

    ``seq_lens[i]`` counts every token of request i that is in the cache after this
    step's write, so query token j of request i sits at absolute position
    ``seq_lens[i] - q_len[i] + j``. ``slot_mapping`` is -1 for padded tokens (no write).
    ``extra`` carries what a ModelState adds for its own layers (state rows, ...).
    """

    num_reqs: int
    num_tokens: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    max_query_len: int
    max_seq_len: int
    causal: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


class AttentionBackend(ABC):
    """Writes new K/V into the paged cache and attends over it."""

    name: str = "abstract"

    @abstractmethod
    def write_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttnMetadata) -> None:
        """Store ``k``/``v`` ([num_tokens, kv_heads, head_size]) at ``md.slot_mapping``."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, kv_cache: torch.Tensor, md: AttnMetadata, scale: float
    ) -> torch.Tensor:
        """Attention of ``q`` ([num_tokens, heads, head_size]) over the cached context."""

    # ---- MLA: one latent vector per token (see core_runner.attention.mla) ----------
    def write_mla(self, latent_cache: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
                  md: AttnMetadata) -> None:
        """Store each token's latent ``kv_c`` [T, L] and roped key ``k_pe`` [T, R] in
        ``latent_cache`` [1, num_blocks, block_size, 1, L + R] at ``md.slot_mapping``."""
        from core_runner.attention.mla import write_latent

        write_latent(self, latent_cache, kv_c, k_pe, md)

    def forward_mla(self, q_c: torch.Tensor, q_pe: torch.Tensor, latent_cache: torch.Tensor,
                    md: AttnMetadata, scale: float) -> torch.Tensor:
        """MLA with kv_b_proj absorbed: ``q_c`` [T, H, L] (W_UK^T q_nope), ``q_pe`` [T, H, R];
        returns softmax(q_c.c + q_pe.k_pe) @ c as [T, H, L]. Backends without an MLA
        path raise NotImplementedError naming themselves."""
        from core_runner.attention.mla import mla_forward

        return mla_forward(self, q_c, q_pe, latent_cache, md, scale)


def get_backend(name: str) -> AttentionBackend:
    if name == "torch":
        from core_runner.attention.torch_backend import TorchPagedAttention

        return TorchPagedAttention()
    if name == "triton":
        from core_runner.attention.triton_backend import TritonPagedAttention

        return TritonPagedAttention()
    raise ValueError(f"attention backend {name!r} is unknown: expected 'torch' or 'triton'")
