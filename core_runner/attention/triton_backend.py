"""Triton attention backend: the cache write and one-launch paged attention.

It forwards the host-side bounds of the metadata (max_query_len, max_seq_len) so
that the kernels never read device values, which keeps forward capturable in CUDA
graphs; everything else it reads is device tensors.
"""
from __future__ import annotations

import torch

from core_runner.attention.backend import AttentionBackend, AttnMetadata
from core_runner.attention.options import ATTENTION_FEATURES, AttentionOptions
from core_runner.kernels.kv_write_triton import write_kv_triton
from core_runner.kernels.mla_attention_triton import mla_attention_triton
from core_runner.kernels.paged_attention_triton import paged_attention_triton


class TritonPagedAttention(AttentionBackend):
    name = "triton"
    supports_mla = True
    supports_kv_scales = True
    supports_cuda_graphs = True
    needs_triton = True
    capability = "triton_attention"
    # no symmetric (encoder) window in the kernel: a layer asking for one is refused at construction
    attention_features = frozenset(ATTENTION_FEATURES) - {"bidirectional_window"}

    def write_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttnMetadata,
                 kv_scale: torch.Tensor | None = None) -> None:
        write_kv_triton(kv_cache, k, v, md.slot_mapping, kv_scale)

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, md: AttnMetadata, scale: float,
                options: AttentionOptions | None = None, sinks: torch.Tensor | None = None,
                kv_scale: torch.Tensor | None = None) -> torch.Tensor:
        o = options or AttentionOptions()
        return paged_attention_triton(
            q,
            kv_cache,
            md.query_start_loc,
            md.seq_lens,
            md.block_tables,
            scale,
            causal=md.causal,
            max_query_len=md.max_query_len,
            max_seq_len=md.max_seq_len,
            sliding_window=o.sliding_window,
            logits_soft_cap=o.logits_soft_cap,
            sinks=sinks if o.sinks else None,
            kv_scale=kv_scale,
        )

    def forward_mla(self, q_c: torch.Tensor, q_pe: torch.Tensor, latent_cache: torch.Tensor,
                    md: AttnMetadata, scale: float, kv_scale: torch.Tensor | None = None) -> torch.Tensor:
        if not md.causal:
            raise NotImplementedError("MLA attention is implemented for causal attention only")
        return mla_attention_triton(q_c, q_pe, latent_cache, md.query_start_loc, md.seq_lens, md.block_tables,
                                    scale, max_query_len=md.max_query_len, max_seq_len=md.max_seq_len,
                                    kv_scale=kv_scale)
