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


def test_moe_align_leaves_out_ids_outside_the_experts():
    """Expert parallelism marks other ranks' experts -1: those pairs are in no tile."""
    e, block_m = 4, 16
    ids = torch.tensor([[0, -1], [3, 2], [-1, -1], [1, 3], [2, 0]], dtype=torch.int32)
    sorted_pairs, block_expert = moe_align(ids, e, block_m)
    flat = ids.reshape(-1).long()
    n = flat.numel()
    real = sorted_pairs[sorted_pairs < n].long()
    assert sorted(real.tolist()) == [p for p in range(n) if flat[p] >= 0]
    for b, ex in enumerate(block_expert.tolist()):
        tile = sorted_pairs[b * block_m:(b + 1) * block_m].long()
        tile = tile[tile < n]
        assert (flat[tile] == ex).all() if ex >= 0 else tile.numel() == 0


def test_fused_moe_triton_skips_ids_outside_the_experts(device):
    g = torch.Generator().manual_seed(3)
    t, e, k, h, i = 19, 4, 3, 32, 16
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * i, h, generator=g) * 0.2
    w2 = torch.randn(e, h, i, generator=g) * 0.2
    w, ids = _routing(t, 2 * e, k, g)  # ids of 2e experts: those >= e belong to another rank
    local = torch.where(ids < e, ids, -1)
    # the same sum with the skipped pairs' weights zeroed and their ids on a real expert
    expected = fused_moe_ref(x, w13, w2, torch.where(ids < e, w, 0.0), torch.where(ids < e, ids, 0))
    torch.testing.assert_close(fused_moe_ref(x, w13, w2, w, local), expected, rtol=1e-5, atol=1e-6)
    out = fused_moe_triton(x.to(device), w13.to(device), w2.to(device), w.to(device), local.to(device),
                           skip_invalid_ids=True)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp", "ep"])
def test_split_layer_triton_equals_torch(device, expert_parallel):
    """Each rank's FusedMoE (local shapes; global ids mapped to local under EP) gives the
    same partial sum with the Triton kernel as with the torch reference."""
    from core_runner.distributed.parallel_state import GroupCoordinator, set_tp_group
    from core_runner.layers.fused_moe import FusedMoE

    g = torch.Generator().manual_seed(5)
    t, e, k, h, i = 23, 8, 2, 32, 32
    x = torch.randn(t, h, generator=g)
    w, ids = _routing(t, e, k, g)
    gate_up = torch.randn(e, 2 * i, h, generator=g) * 0.2
    down = torch.randn(e, h, i, generator=g) * 0.2
    for rank in range(2):
        prev = set_tp_group(GroupCoordinator(rank=rank, world_size=2, expert_parallel=expert_parallel))
        try:
            layers = [FusedMoE(e, h, i, impl=impl, reduce_results=False) for impl in ("torch", "triton")]
        finally:
            set_tp_group(prev)
        outs = []
        for moe in layers:
            moe.w13.weight_loader(moe.w13.weight, gate_up)
            moe.w2.weight_loader(moe.w2.weight, down)
            outs.append(moe.to(device)(x.to(device), w.to(device), ids.to(device)).cpu())
        assert outs[0].abs().max() > 0.1, f"rank {rank}: its experts saw no tokens"
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)


def test_config_override_reaches_the_kernel(device, monkeypatch):
    """Tile overrides (as a sweep gives them) are what both launches run with, and any
    valid tiling gives the same sum."""
    import core_runner.kernels.fused_moe_triton as fmt

    launched = []
    real_launch = fmt._launch
    monkeypatch.setattr(fmt, "_launch", lambda *args: launched.append(dict(args[-1])) or real_launch(*args))
    g = torch.Generator().manual_seed(7)
    t, e, k, h, i = 21, 4, 2, 48, 40
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * i, h, generator=g) * 0.2
    w2 = torch.randn(e, h, i, generator=g) * 0.2
    w, ids = _routing(t, e, k, g)
    ref = fused_moe_ref(x, w13, w2, w, ids)
    args = [a.to(device) for a in (x, w13, w2, w, ids)]
    for cfg in ({"BLOCK_M": 16}, {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 8}):
        launched.clear()
        out = fmt.fused_moe_triton(*args, config=cfg)
        assert len(launched) == 2 and all(c | cfg == c for c in launched), launched
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="unknown"):
        fmt.fused_moe_triton(*args, config={"BLOCK_SIZE_M": 16})
    with pytest.raises(ValueError, match="disagree"):
        fmt.fused_moe_triton(*args, block_m=16, config={"BLOCK_M": 32})
