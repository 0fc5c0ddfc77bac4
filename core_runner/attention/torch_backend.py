"""Reference paged attention in plain torch: the ground truth for every kernel.

Correct on any device, written for clarity: one request at a time, K/V gathered
through the block table, an explicit causal mask.
"""
from __future__ import annotations

import torch

from core_runner.attention.backend import AttentionBackend, AttnMetadata


def write_kv_ref(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """kv_cache: [2, num_blocks, block_size, kv_heads, head_size]; slots < 0 are skipped."""
    flat = kv_cache.view(kv_cache.shape[0], -1, kv_cache.shape[3], kv_cache.shape[4])
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    flat[0].index_copy_(0, slots, k[keep].to(kv_cache.dtype))
    if kv_cache.shape[0] > 1:
        flat[1].index_copy_(0, slots, v[keep].to(kv_cache.dtype))


def gather_context(part: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Tokens 0..seq_len-1 of one request from a cache part [num_blocks, bs, H, D]."""
    bs = part.shape[1]
    nblk = -(-seq_len // bs)
    return part[block_table[:nblk].long()].reshape(-1, part.shape[2], part.shape[3])[:seq_len]


def paged_attention_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc_cpu: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """q: [num_tokens, heads, D] -> [num_tokens, heads, D] (float32 math)."""
    out = torch.zeros_like(q)
    num_heads = q.shape[1]
    kv_heads = kv_cache.shape[3]
    group = num_heads // kv_heads
    qsl = query_start_loc_cpu.tolist()
    lens = seq_lens_cpu.tolist()
    for i in range(len(lens)):
        s, e, seq_len = qsl[i], qsl[i + 1], lens[i]
        if e == s or seq_len == 0:
            continue
        k = gather_context(kv_cache[0], block_tables[i], seq_len).float()
        v = gather_context(kv_cache[-1], block_tables[i], seq_len).float()
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        qi = q[s:e].float()
        scores = torch.einsum("qhd,khd->hqk", qi, k) * scale
        if causal:
            qpos = torch.arange(seq_len - (e - s), seq_len, device=q.device)
            kpos = torch.arange(seq_len, device=q.device)
            scores = scores.masked_fill(kpos[None, None, :] > qpos[None, :, None], float("-inf"))
        probs = scores.softmax(dim=-1)
        out[s:e] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out


class TorchPagedAttention(AttentionBackend):
    """Correct anywhere; reads host copies of the metadata, so it cannot be graph-captured."""

    name = "torch"
    supports_mla = True

    def write_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttnMetadata) -> None:
        write_kv_ref(kv_cache, k, v, md.slot_mapping)

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, md: AttnMetadata, scale: float) -> torch.Tensor:
        return paged_attention_ref(
            q, kv_cache, md.query_start_loc_cpu, md.seq_lens_cpu, md.block_tables, scale, md.causal
        )

    def forward_mla(self, q_c: torch.Tensor, q_pe: torch.Tensor, latent_cache: torch.Tensor,
                    md: AttnMetadata, scale: float) -> torch.Tensor:
        from core_runner.attention.mla import mla_attention_ref

        if not md.causal:
            raise NotImplementedError("MLA attention is implemented for causal attention only")
        return mla_attention_ref(q_c, q_pe, latent_cache, md.query_start_loc_cpu, md.seq_lens_cpu,
                                 md.block_tables, scale)
