"""A stateless counter-based RNG keyed by (seed, position, vocab index).

The same 32-bit integer hash is written for torch (here) and for Triton, so CPU and
GPU draw the same uniforms. Per token it is one murmur3 finaliser round over the column
(times the golden ratio) xor the row's first key, then xor the second key: the column
-> hash map is a bijection for every row, and one round keeps the kernel's per-token
cost (which bounds the sampler's speed) at ~10 integer instructions. torch has no uint32
arithmetic, so products are formed in int64 from 16-bit halves and masked, which never
overflows and matches the wrapping uint32 multiply of the kernel (native uint32 arithmetic) bit for bit.

A uniform is (top 24 bits of the hash + 0.5) / 2**24 in float32. For the top value
2**24 - 1 that sum rounds up to 2**24 (float32 has 24 bits), i.e. u = 1 and an infinite
Gumbel draw: that token would win whatever its logit (one row in ~110 at vocab 151,936).
u is therefore clamped to U_MAX = 1 - 2**-24, the largest float32 below 1, which no other
hash value produces; every other number is unchanged.
"""
from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B1
M1 = 0x85EBCA6B
M2 = 0xC2B2AE35
U_MAX = 1.0 - 2.0**-24  # largest float32 below 1


def mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 tensors holding uint32 values."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def fmix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = mul32(x, M1)
    x = x ^ (x >> 13)
    x = mul32(x, M2)
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 32-bit keys per row from a 64-bit seed and the sampled token's position."""
    seeds = seeds.to(torch.int64)
    lo = seeds & MASK32
    hi = (seeds >> 32) & MASK32
    pos = positions.to(torch.int64) & MASK32
    k1 = fmix32(lo ^ fmix32(hi ^ mul32(pos + 1, GOLDEN)))
    k2 = fmix32(k1 ^ M2)
    return k1, k2


def uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[n, vocab_size] float32 uniforms in (0, 1), a pure function of the inputs."""
    k1, k2 = row_keys(seeds, positions)
    col = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    h = fmix32(mul32(col + 1, GOLDEN)[None, :] ^ k1[:, None]) ^ k2[:, None]
    return (((h >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)).clamp_(max=U_MAX)


def gumbel(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    u = uniform(seeds, positions, vocab_size)
    return -torch.log(-torch.log(u))
