"""Gumbel-Max sampling in one pass over the logits (Triton twin of ``Sampler``'s
temperature path, drawing the very numbers of ``core_runner.sample.rng``).

One program per request streams its logits row in tiles, adds Gumbel noise made by
the stateless hash keyed by (seed, position, vocab index), and keeps a running
argmax. Temperature-0 rows skip the noise: plain argmax. Nothing of size
batch x vocab is allocated. The hash is computed in uint64 with explicit 32-bit
masks, so it equals the torch version (which builds the products from 16-bit halves).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# The constants are those of core_runner.sample.rng (GOLDEN, M1, M2); the kernel test
# compares the two draws bit for bit.

@triton.jit
def _fmix32(x):
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _gumbel_argmax_kernel(
    logits_ptr, s_row, temp_ptr, seed_ptr, pos_ptr, out_ptr, vocab,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    t = tl.load(temp_ptr + i)
    seed = tl.load(seed_ptr + i).to(tl.uint64)
    pos = tl.load(pos_ptr + i).to(tl.uint64) & 0xFFFFFFFF
    lo = seed & 0xFFFFFFFF
    hi = (seed >> 32) & 0xFFFFFFFF
    k1 = _fmix32(lo ^ _fmix32(hi ^ (((pos + 1) * 0x9E3779B1) & 0xFFFFFFFF)))
    k2 = _fmix32(k1 ^ 0xC2B2AE35)
    inv_t = 1.0 / tl.where(t > 0, t, 1.0)
    best = -float("inf")
    best_idx = 0
    row = logits_ptr + i.to(tl.int64) * s_row
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < vocab
        x = tl.load(row + cols, mask=mask, other=-float("inf")).to(tl.float32)
        if t > 0:
            c = cols.to(tl.uint64)
            h = _fmix32((((c + 1) * 0x9E3779B1) & 0xFFFFFFFF) ^ k1)
            h = _fmix32(h ^ k2)
            u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
            x = x * inv_t - tl.log(-tl.log(u))
        x = tl.where(mask, x, -float("inf"))
        m = tl.max(x, axis=0)
        idx = tl.argmax(x, axis=0) + start
        take = m > best
        best_idx = tl.where(take, idx, best_idx)
        best = tl.where(take, m, best)
    tl.store(out_ptr + i, best_idx.to(tl.int64))


def gumbel_sample_triton(
    logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
    out: torch.Tensor | None = None, block: int = 2048,
) -> torch.Tensor:
    """[n, V] logits (any float dtype) -> [n] int64 tokens; temperature 0 = argmax."""
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if out is None:
        out = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n:
        _gumbel_argmax_kernel[(n,)](
            logits, logits.stride(0), temperature, seeds, positions, out, vocab, BLOCK=block,
        )
    return out
