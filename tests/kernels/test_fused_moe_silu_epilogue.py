"""``fused_moe_triton(fuse_activation=True)``: silu(gate) * up computed in the first GEMM's
epilogue (two accumulators) instead of a [pairs, 2I] tensor and the silu_mul kernel. It
must give what the unfused path gives (same roundings), under any tiling, with expert
biases, and refuse the activations it does not fuse."""
from __future__ import annotations

import pytest
import torch

import core_runner.kernels.fused_moe_triton as fmt
from core_runner.layers.fused_moe import fused_moe_ref


def _case(t: int, e: int, k: int, h: int, i: int, seed: int, bias: bool = False) -> tuple[list, dict]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * i, h, generator=g) * 0.2
    w2 = torch.randn(e, h, i, generator=g) * 0.2
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    w = torch.rand(t, k, generator=g)
    kw = {"w13_bias": torch.randn(e, 2 * i, generator=g), "w2_bias": torch.randn(e, h, generator=g)} if bias else {}
    return [x, w13, w2, w, ids], kw


def _to(device, args, kw):
    return [a.to(device) for a in args], {n: v.to(device) for n, v in kw.items()}


@pytest.mark.parametrize("t,e,k,h,i", [(1, 4, 2, 32, 16), (13, 8, 2, 48, 24), (37, 6, 3, 40, 72)])
@pytest.mark.parametrize("cfg", [None, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16}], ids=["default", "narrow"])
def test_fused_epilogue_equals_the_separate_kernel(device, t, e, k, h, i, cfg):
    """I = 24 and 72 are not multiples of BLOCK_N: the last gate / up tile is partly masked."""
    args, kw = _to(device, *_case(t, e, k, h, i, seed=h + t))
    unfused = fmt.fused_moe_triton(*args, config=cfg)
    fused = fmt.fused_moe_triton(*args, config=cfg, fuse_activation=True)
    torch.testing.assert_close(fused, unfused, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fused.cpu(), fused_moe_ref(*_case(t, e, k, h, i, seed=h + t)[0]), rtol=1e-4, atol=1e-5)


def test_fused_epilogue_adds_each_expert_bias_to_gate_and_up(device):
    args, kw = _case(21, 5, 2, 32, 40, seed=3, bias=True)
    ref = fused_moe_ref(*args, **kw)
    dargs, dkw = _to(device, args, kw)
    out = fmt.fused_moe_triton(*dargs, **dkw, fuse_activation=True)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    # the up half's bias is read N columns further on: a bias only on the up half must move the result
    up_only = dict(dkw, w13_bias=dkw["w13_bias"].clone())
    up_only["w13_bias"][:, :40] = 0
    moved = fmt.fused_moe_triton(*dargs, **up_only, fuse_activation=True)
    torch.testing.assert_close(moved.cpu(), fused_moe_ref(*args, **{**kw, "w13_bias": up_only["w13_bias"].cpu()}),
                               rtol=1e-4, atol=1e-4)
    assert not torch.allclose(moved, out)


def test_fused_path_launches_no_activation_kernel(device, monkeypatch):
    launched = []
    real = fmt._launch
    monkeypatch.setattr(fmt, "_launch",
                        lambda *a, **kw: launched.append(kw.get("silu_gate_up", False)) or real(*a, **kw))

    def no_silu(*_a, **_kw):
        raise AssertionError("silu_mul_triton ran on the fused path")

    monkeypatch.setattr(fmt, "silu_mul_triton", no_silu)
    args, _ = _to(device, *_case(9, 4, 2, 32, 16, seed=5))
    fmt.fused_moe_triton(*args, fuse_activation=True)
    assert launched == [True, False]  # the first GEMM fused, the down GEMM as before


def test_fuse_activation_refuses_swigluoai(device):
    args, _ = _to(device, *_case(3, 4, 2, 32, 16, seed=6))
    with pytest.raises(ValueError, match="fuse_activation=True supports activation 'silu' only"):
        fmt.fused_moe_triton(*args, activation="swigluoai", fuse_activation=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_epilogue_bf16_gpu_equals_the_separate_kernel():
    """bf16 at a DeepSeek-V2-Lite-like width (I = 1408 is not a multiple of 128)."""
    g = torch.Generator().manual_seed(11)
    t, e, k, h, i = 300, 64, 6, 256, 1408
    x = torch.randn(t, h, generator=g).cuda().bfloat16()
    w13 = (torch.randn(e, 2 * i, h, generator=g) * 0.05).cuda().bfloat16()
    w2 = (torch.randn(e, h, i, generator=g) * 0.05).cuda().bfloat16()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32).cuda()
    w = torch.rand(t, k, generator=g).cuda()
    unfused = fmt.fused_moe_triton(x, w13, w2, w, ids)
    fused = fmt.fused_moe_triton(x, w13, w2, w, ids, fuse_activation=True)
    err = ((fused.float() - unfused.float()).abs().max() / unfused.float().abs().max()).item()
    assert err <= 1e-2, err
