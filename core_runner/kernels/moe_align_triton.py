"""The fused MoE's pair alignment in three launches (Triton twin of
``fused_moe_triton.moe_align``, whose outputs it reproduces exactly).

``moe_align`` sorts the T * top_k (token, expert) pairs by expert with ~20 torch kernels
(histogram, two cumsums, a radix sort, scatters, a searchsorted); at decode sizes each is a
few microseconds of launch and tail, per MoE layer and step. Here:

1. ``_chunk_counts`` (one program per CHUNK pairs): each chunk's histogram of experts
   (ids outside [0, E) go to bin E, lanes past the last pair to bin E + 1), and the
   program's share of ``sorted_pairs`` filled with the sentinel (num_pairs).
2. ``_plan`` (one program): the experts' totals, their runs padded to BLOCK_M, and for
   every (chunk, expert) where that chunk's pairs of the expert start in ``sorted_pairs``
   (the padded start of the expert plus the pairs of earlier chunks): a stable order, as
   the torch reference's stable sort gives; then each tile's expert (-1 past the end).
3. ``_scatter`` (one program per chunk): a pair's place is its (chunk, expert) start plus
   the pairs of its expert earlier in its chunk.

Every size comes from host ints (num_pairs, num_experts, BLOCK_M), so a CUDA graph can
capture the three launches.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 128  # pairs a program ranks: a CHUNK x CHUNK comparison
SCAN_ROWS = 32  # chunks the planning program takes at once


@triton.jit(do_not_specialize=["num_pairs", "num_chunks", "max_padded"])
def _chunk_counts(ids_ptr, counts_ptr, sorted_ptr, num_pairs, num_chunks, max_padded, num_experts,
                  BLOCK_E: tl.constexpr, CHUNK: tl.constexpr, FILL: tl.constexpr):
    c = tl.program_id(0)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=0)
    b = tl.where((ids >= 0) & (ids < num_experts), ids, num_experts).to(tl.int32)
    b = tl.where(offs < num_pairs, b, num_experts + 1)
    tl.store(counts_ptr + c * BLOCK_E + tl.arange(0, BLOCK_E), tl.histogram(b, BLOCK_E))
    per = tl.cdiv(max_padded, num_chunks)
    end = tl.minimum((c + 1) * per, max_padded)
    for f0 in range(c * per, end, FILL):
        f = f0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + f, tl.full([FILL], 0, tl.int32) + num_pairs, mask=f < end)


@triton.jit(do_not_specialize=["num_chunks", "num_tiles"])
def _plan(counts_ptr, base_ptr, block_expert_ptr, num_chunks, num_tiles, num_experts, block_m,
          BLOCK_E: tl.constexpr, ROWS: tl.constexpr, TILES: tl.constexpr):
    e = tl.arange(0, BLOCK_E)
    rows = tl.arange(0, ROWS)
    total = tl.zeros([BLOCK_E], dtype=tl.int32)
    for r0 in range(0, num_chunks, ROWS):
        r = r0 + rows
        h = tl.load(counts_ptr + r[:, None] * BLOCK_E + e[None, :], mask=(r < num_chunks)[:, None], other=0)
        total += tl.sum(h, axis=0)
    expert = e < num_experts
    padded = tl.where(expert, (total + block_m - 1) // block_m * block_m, 0)
    pad_end = tl.cumsum(padded, axis=0)
    carry = pad_end - padded  # where each expert's run starts
    for r0 in range(0, num_chunks, ROWS):
        r = r0 + rows
        ok = (r < num_chunks)[:, None]
        h = tl.load(counts_ptr + r[:, None] * BLOCK_E + e[None, :], mask=ok, other=0)
        before = tl.cumsum(h, axis=0) - h  # pairs of each expert in earlier chunks of this block
        tl.store(base_ptr + r[:, None] * BLOCK_E + e[None, :], carry[None, :] + before, mask=ok)
        carry += tl.sum(h, axis=0)
    for t0 in range(0, num_tiles, TILES):
        t = t0 + tl.arange(0, TILES)
        ends = tl.where(expert, pad_end, 2147483647)
        ex = tl.sum((ends[None, :] <= (t * block_m)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + t, tl.where(ex < num_experts, ex, -1), mask=t < num_tiles)


@triton.jit(do_not_specialize=["num_pairs"])
def _scatter(ids_ptr, base_ptr, sorted_ptr, num_pairs, num_experts,
             BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
    c = tl.program_id(0)
    i = tl.arange(0, CHUNK)
    offs = c * CHUNK + i
    live = offs < num_pairs
    ids = tl.load(ids_ptr + offs, mask=live, other=0)
    keep = live & (ids >= 0) & (ids < num_experts)
    b = tl.where(keep, ids, num_experts).to(tl.int32)
    earlier = (b[:, None] == b[None, :]) & (i[None, :] < i[:, None])
    rank = tl.sum(earlier.to(tl.int32), axis=1)
    start = tl.load(base_ptr + c * BLOCK_E + b, mask=keep, other=0)
    tl.store(sorted_ptr + start + rank, offs, mask=keep)


def moe_align_triton(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids: [T, top_k] -> (sorted_pairs int32 [max_padded], block_expert int32 [max_blocks]),
    equal to ``moe_align``'s; pairs with an id outside [0, num_experts) are in no tile."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).contiguous()  # int32 or int64 ids: the kernels read either
    n = flat.numel()
    max_padded = triton.cdiv(n + num_experts * (block_m - 1), block_m) * block_m
    num_tiles = max_padded // block_m
    sorted_pairs = torch.empty(max_padded, dtype=torch.int32, device=device)
    block_expert = torch.empty(num_tiles, dtype=torch.int32, device=device)
    if n == 0:
        return sorted_pairs.fill_(0), block_expert.fill_(-1)
    block_e = triton.next_power_of_2(num_experts + 2)  # + the bins of left-out ids and of padding lanes
    num_chunks = triton.cdiv(n, CHUNK)
    counts = torch.empty((num_chunks, block_e), dtype=torch.int32, device=device)
    base = torch.empty_like(counts)
    _chunk_counts[(num_chunks,)](flat, counts, sorted_pairs, n, num_chunks, max_padded, num_experts,
                                 BLOCK_E=block_e, CHUNK=CHUNK, FILL=256)
    _plan[(1,)](counts, base, block_expert, num_chunks, num_tiles, num_experts, block_m,
                BLOCK_E=block_e, ROWS=SCAN_ROWS, TILES=max(16, 4096 // block_e))
    _scatter[(num_chunks,)](flat, base, sorted_pairs, n, num_experts, BLOCK_E=block_e, CHUNK=CHUNK)
    return sorted_pairs, block_expert
