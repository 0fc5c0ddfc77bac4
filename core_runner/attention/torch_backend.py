"""Reference paged attention in plain torch: the ground truth for every kernel.

Correct on any device, written for clarity: one request at a time, K/V gathered
through the block table, an explicit causal mask.
"""
from __future__ import annotations

import torch

from core_runner.attention.backend import AttentionBackend, AttnMetadata
from core_runner.attention.options import ATTENTION_FEATURES, AttentionOptions
from core_runner.kv_cache_dtype import is_fp8, quantize_ref


def _raw(t: torch.Tensor) -> torch.Tensor:
    """An fp8 tensor as bytes: torch's CPU index kernels have no fp8 versions."""
    return t.view(torch.uint8) if is_fp8(t.dtype) else t


def write_kv_ref(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
                 kv_scale: torch.Tensor | None = None) -> None:
    """kv_cache: [2, num_blocks, block_size, kv_heads, head_size]; slots < 0 are skipped.
    An fp8 cache stores the values saturated to its range (``kv_cache_dtype.quantize_ref``),
    divided by ``kv_scale`` [2] (k, v; a one-part cache uses [0]) when given."""
    flat = _raw(kv_cache).view(kv_cache.shape[0], -1, kv_cache.shape[3], kv_cache.shape[4])
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    ks, vs = (1.0, 1.0) if kv_scale is None else (kv_scale[0], kv_scale[1])
    flat[0].index_copy_(0, slots, _raw(quantize_ref(k[keep], kv_cache.dtype, ks)))
    if kv_cache.shape[0] > 1:
        flat[1].index_copy_(0, slots, _raw(quantize_ref(v[keep], kv_cache.dtype, vs)))


def gather_context(part: torch.Tensor, block_table: torch.Tensor, seq_len: int, start: int = 0) -> torch.Tensor:
    """Tokens start..seq_len-1 of one request from a cache part [num_blocks, bs, H, D];
    ``start`` is a multiple of the block size, and no block before it is read."""
    bs = part.shape[1]
    nblk = -(-seq_len // bs)
    got = _raw(part)[block_table[start // bs:nblk].long()].reshape(-1, part.shape[2], part.shape[3])[:seq_len - start]
    return got.view(part.dtype)


def paged_attention_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc_cpu: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    causal: bool = True,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    kv_scale: torch.Tensor | None = None,
    bidirectional_window: int | None = None,
) -> torch.Tensor:
    """q: [num_tokens, heads, D] -> [num_tokens, heads, D] (float32 math); cache entries read
    as ``entry * kv_scale`` (k, v) when ``kv_scale`` [2] is given. A query at
    position p sees keys p - sliding_window < k <= p; scores are soft-capped after the
    scale; ``sinks`` [heads] are logits with a zero value in every row's softmax. Blocks
    wholly before every query's window are never read (the block manager may have freed
    them). ``bidirectional_window`` w (non-causal only): a query at p sees keys with
    |k - p| <= w (transformers' ModernBERT bound); blocks wholly before first_q - w are
    not read."""
    out = torch.zeros_like(q)
    num_heads = q.shape[1]
    kv_heads, bs = kv_cache.shape[3], kv_cache.shape[2]
    group = num_heads // kv_heads
    qsl = query_start_loc_cpu.tolist()
    lens = seq_lens_cpu.tolist()
    for i in range(len(lens)):
        s, e, seq_len = qsl[i], qsl[i + 1], lens[i]
        if e == s or seq_len == 0:
            continue
        if sliding_window is not None and not causal:
            raise NotImplementedError("sliding_window is implemented for causal attention only: a bidirectional "
                                      "layer's window is bidirectional_window")
        if bidirectional_window is not None and causal:
            raise NotImplementedError("bidirectional_window is implemented for non-causal attention only: a causal "
                                      "layer's window is sliding_window")
        qpos = torch.arange(seq_len - (e - s), seq_len, device=q.device)
        # the first block any query's window reaches; earlier ones may belong to others now
        # (queries are the request's last tokens: no key lies after the last query's window)
        lo = 0
        if sliding_window is not None:
            lo = max(0, int(qpos[0]) - sliding_window + 1) // bs * bs
        elif bidirectional_window is not None:
            lo = max(0, int(qpos[0]) - bidirectional_window) // bs * bs
        k = gather_context(kv_cache[0], block_tables[i], seq_len, lo).float()
        v = gather_context(kv_cache[-1], block_tables[i], seq_len, lo).float()
        if kv_scale is not None:
            k, v = k * kv_scale[0], v * kv_scale[-1]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        qi = q[s:e].float()
        scores = torch.einsum("qhd,khd->hqk", qi, k) * scale
        if logits_soft_cap is not None:
            scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
        kpos = torch.arange(lo, seq_len, device=q.device)
        hidden = torch.zeros(scores.shape[1:], dtype=torch.bool, device=q.device)
        if causal:
            hidden |= kpos[None, :] > qpos[:, None]
        if sliding_window is not None:
            hidden |= kpos[None, :] <= qpos[:, None] - sliding_window
        if bidirectional_window is not None:
            hidden |= (kpos[None, :] - qpos[:, None]).abs() > bidirectional_window
        scores = scores.masked_fill(hidden[None], float("-inf"))
        if sinks is not None:
            sink = sinks.float().view(-1, 1, 1).expand(-1, scores.shape[1], 1)
            probs = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
        else:
            probs = scores.softmax(dim=-1)
        out[s:e] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out


class TorchPagedAttention(AttentionBackend):
    """Correct anywhere; reads host copies of the metadata, so it cannot be graph-captured."""

    name = "torch"
    supports_mla = True
    supports_kv_scales = True
    attention_features = frozenset(ATTENTION_FEATURES)

    def write_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttnMetadata,
                 kv_scale: torch.Tensor | None = None) -> None:
        write_kv_ref(kv_cache, k, v, md.slot_mapping, kv_scale)

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, md: AttnMetadata, scale: float,
                options: AttentionOptions | None = None, sinks: torch.Tensor | None = None,
                kv_scale: torch.Tensor | None = None) -> torch.Tensor:
        o = options or AttentionOptions()
        return paged_attention_ref(
            q, kv_cache, md.query_start_loc_cpu, md.seq_lens_cpu, md.block_tables, scale, md.causal,
            o.sliding_window, o.logits_soft_cap, sinks if o.sinks else None, kv_scale,
            o.bidirectional_window,
        )

    def forward_mla(self, q_c: torch.Tensor, q_pe: torch.Tensor, latent_cache: torch.Tensor,
                    md: AttnMetadata, scale: float, kv_scale: torch.Tensor | None = None) -> torch.Tensor:
        from core_runner.attention.mla import mla_attention_ref

        if not md.causal:
            raise NotImplementedError("MLA attention is implemented for causal attention only")
        return mla_attention_ref(q_c, q_pe, latent_cache, md.query_start_loc_cpu, md.seq_lens_cpu,
                                 md.block_tables, scale, kv_scale=kv_scale)
