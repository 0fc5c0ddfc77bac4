"""MLA (multi-head latent attention) over a paged latent cache: the torch reference and
the cache write behind ``AttentionBackend.write_mla``.

The latent cache is a PagedCacheSpec with one part and one head:
``[1, num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]``; each token stores
its normalised latent c followed by its roped shared key k_pe. The caller absorbs
kv_b_proj: the query reaching the backend is q_c = W_UK^T q_nope (one L-vector per head)
plus q_pe; the backend returns sum_j p_j c_j per head, which the caller maps through
W_UV. So attention reads only the latent cache, in prefill as in decode.
"""
from __future__ import annotations

import torch

from core_runner.attention.backend import AttnMetadata
from core_runner.attention.torch_backend import gather_context


def mla_attention_ref(
    q_c: torch.Tensor,
    q_pe: torch.Tensor,
    latent_cache: torch.Tensor,
    query_start_loc_cpu: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    causal: bool = True,
    kv_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q_c: [T, H, L], q_pe: [T, H, R] -> [T, H, L] (float32 math, one request at a time);
    cache entries read as ``entry * kv_scale[0]`` when ``kv_scale`` is given."""
    lora = q_c.shape[-1]
    out = torch.zeros_like(q_c)
    qsl = query_start_loc_cpu.tolist()
    lens = seq_lens_cpu.tolist()
    for i in range(len(lens)):
        s, e, seq_len = qsl[i], qsl[i + 1], lens[i]
        if e == s or seq_len == 0:
            continue
        ctx = gather_context(latent_cache[0], block_tables[i], seq_len)[:, 0].float()  # [S, L + R]
        if kv_scale is not None:
            ctx = ctx * kv_scale[0]
        c, pe = ctx[:, :lora], ctx[:, lora:]
        scores = (torch.einsum("qhl,kl->hqk", q_c[s:e].float(), c)
                  + torch.einsum("qhr,kr->hqk", q_pe[s:e].float(), pe)) * scale
        if causal:
            qpos = torch.arange(seq_len - (e - s), seq_len, device=q_c.device)
            kpos = torch.arange(seq_len, device=q_c.device)
            scores = scores.masked_fill(kpos[None, None, :] > qpos[None, :, None], float("-inf"))
        out[s:e] = torch.einsum("hqk,kl->qhl", scores.softmax(dim=-1), c).to(q_c.dtype)
    return out


def write_latent(backend: object, latent_cache: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
                 md: AttnMetadata, kv_scale: torch.Tensor | None = None) -> None:
    """Store [kv_c | k_pe] ([T, L] and [T, R]) of each token at ``md.slot_mapping``
    through the backend's own (one-part) cache write (a one-part write uses kv_scale[0])."""
    entry = torch.cat([kv_c, k_pe], dim=-1).unsqueeze(1)
    if kv_scale is None:
        backend.write_kv(latent_cache, entry, None, md)
    else:
        backend.write_kv(latent_cache, entry, None, md, kv_scale=kv_scale)
