"""Fused MoE grouped GEMM (Triton) against the torch reference; alignment invariants."""
from __future__ import annotations

import pytest
import torch

from core_runner.kernels.fused_moe_triton import fused_moe_triton, moe_align
from core_runner.layers.fused_moe import fused_moe_ref


def _routing(t: int, e: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    w = torch.rand(t, k, generator=g)
    return w, ids


@pytest.mark.parametrize("t,e,k,block_m", [(1, 4, 1, 16), (7, 8, 2, 16), (40, 6, 3, 16), (9, 3, 2, 32)])
def test_moe_align_invariants(t, e, k, block_m):
    g = torch.Generator().manual_seed(t)
    _, ids = _routing(t, e, k, g)
    sorted_pairs, block_expert = moe_align(ids, e, block_m)
    n = t * k
    assert sorted_pairs.numel() % block_m == 0 and block_expert.numel() == sorted_pairs.numel() // block_m
    flat = ids.reshape(-1).long()
    real = sorted_pairs[sorted_pairs < n].long()
    assert sorted(real.tolist()) == list(range(n))  # every pair exactly once
    for b, ex in enumerate(block_expert.tolist()):
        tile = sorted_pairs[b * block_m:(b + 1) * block_m].long()
        tile = tile[tile < n]
        if ex < 0:
            assert tile.numel() == 0
        else:
            assert (flat[tile] == ex).all()  # one expert per tile


@pytest.mark.parametrize("t,e,k,h,i", [(1, 4, 2, 32, 16), (13, 8, 2, 48, 24), (37, 6, 3, 40, 72), (70, 4, 1, 32, 16)])
def test_fused_moe_triton_matches_ref(device, t, e, k, h, i):
    g = torch.Generator().manual_seed(h + t)
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * i, h, generator=g) * 0.2
    w2 = torch.randn(e, h, i, generator=g) * 0.2
    w, ids = _routing(t, e, k, g)
    ref = fused_moe_ref(x, w13, w2, w, ids)
    out = fused_moe_triton(x.to(device), w13.to(device), w2.to(device), w.to(device), ids.to(device))
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)


def test_fused_moe_triton_skewed_routing(device):
    """All tokens to one expert (long run, several tiles) and unused experts."""
    g = torch.Generator().manual_seed(0)
    t, e, h, i = 33, 5, 32, 16
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * i, h, generator=g) * 0.2
    w2 = torch.randn(e, h, i, generator=g) * 0.2
    ids = torch.full((t, 2), 3, dtype=torch.int32)
    ids[:, 1] = 1
    w = torch.rand(t, 2, generator=g)
    ref = fused_moe_ref(x, w13, w2, w, ids)
    out = fused_moe_triton(x.to(device), w13.to(device), w2.to(device), w.to(device), ids.to(device), block_m=16)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_moe_bf16_gpu():
    g = torch.Generator().manual_seed(1)
    t, e, k, h, i = 300, 64, 6, 256, 192
    x = torch.randn(t, h, generator=g).cuda().bfloat16()
    w13 = (torch.randn(e, 2 * i, h, generator=g) * 0.05).cuda().bfloat16()
    w2 = (torch.randn(e, h, i, generator=g) * 0.05).cuda().bfloat16()
    w, ids = _routing(t, e, k, g)
    ref = fused_moe_ref(x.float(), w13.float(), w2.float(), w.cuda(), ids.cuda())
    out = fused_moe_triton(x, w13, w2, w.cuda(), ids.cuda())
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
