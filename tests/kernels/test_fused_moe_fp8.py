"""The fp8 fused MoE (kernels/fused_moe_fp8_triton.py) against its torch reference
(layers/fused_moe_fp8.py): interpreter on the CPU at shapes of one or two blocks,
DeepSeek-V3's layer on the GPU.

In float32 the kernel and the reference quantize the same values (the quantizer rounds
in float32 bits, so the interpreter's cast is not involved) and differ only in summation
order: 1e-4 of the output's range. Each test also perturbs one scale block and checks the
result moves by far more than that, so a wrong scale index cannot pass.
"""
from __future__ import annotations

import pytest
import torch

from core_runner.kernels.fused_moe_fp8_triton import act_quant_fp8_triton, fused_moe_fp8_triton
from core_runner.layers.fused_moe import fused_moe_ref
from core_runner.layers.fused_moe_fp8 import fused_moe_fp8_ref, quant_dequant_rows
from core_runner.quantization import quantize_fp8_block

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _routing(t: int, e: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    return torch.rand(t, k, generator=g), ids


def _experts(e: int, h: int, i: int, block: tuple[int, int], g: torch.Generator) -> dict[str, torch.Tensor]:
    w13_q, w13_s = quantize_fp8_block(torch.randn(e, 2 * i, h, generator=g) * 0.3, block)
    w2_q, w2_s = quantize_fp8_block(torch.randn(e, h, i, generator=g) * 0.3, block)
    return {"w13": w13_q, "w13_scale": w13_s, "w2": w2_q, "w2_scale": w2_s}


def _close(out: torch.Tensor, ref: torch.Tensor, rel: float = 1e-4) -> None:
    torch.testing.assert_close(out, ref, rtol=rel, atol=rel * ref.abs().max().item())


def _run(p: dict, block, x, w, ids, device: str, **kw) -> torch.Tensor:
    on = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in p.items()}
    return fused_moe_fp8_triton(x.to(device), on["w13"], on["w13_scale"], on["w2"], on["w2_scale"], block,
                                w.to(device), ids.to(device), **kw).cpu()


# H = 80 and I = 48 leave partial last K blocks (b1 = 32); b1 = 16 takes the float32 dot;
# [1, 32] is the grid compressed-tensors' per-channel scales arrive on
@pytest.mark.parametrize("t,e,k,h,i,block", [(1, 4, 2, 64, 32, (16, 32)), (13, 5, 2, 80, 48, (16, 32)),
                                             (9, 3, 3, 32, 32, (32, 16)), (20, 4, 2, 64, 32, (1, 32))])
def test_fp8_moe_matches_reference(device, t, e, k, h, i, block):
    g = torch.Generator().manual_seed(t + h)
    x = torch.randn(t, h, generator=g)
    p = _experts(e, h, i, block, g)
    w, ids = _routing(t, e, k, g)
    ref = fused_moe_fp8_ref(x, *p.values(), block, w, ids)
    out = _run(p, block, x, w, ids, device)
    assert out.shape == (t, h) and out.dtype == torch.float32
    _close(out, ref)
    # the quantization is real: the dense reference differs by more than the tolerance ...
    dense = fused_moe_ref(x, _dq(p["w13"], p["w13_scale"], block), _dq(p["w2"], p["w2_scale"], block), w, ids)
    assert (dense - ref).abs().max() > 1e-3 * ref.abs().max()
    # ... and so are the scales: doubling one block of a routed expert moves the result
    used = int(ids[0, 0])
    p["w2_scale"] = p["w2_scale"].clone()
    p["w2_scale"][used, -1, -1] *= 2
    assert (_run(p, block, x, w, ids, device) - ref).abs().max() > 1e-2 * ref.abs().max()


def _dq(q: torch.Tensor, s: torch.Tensor, block) -> torch.Tensor:
    from core_runner.quantization.fp8 import dequantize_fp8_block

    return dequantize_fp8_block(q, s, block)


@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
def test_fp8_moe_biases_and_activations(device, activation):
    """gpt-oss's options: per-expert biases inside both GEMMs and the clamped SwiGLU."""
    g = torch.Generator().manual_seed(11)
    t, e, k, h, i, block = 11, 4, 2, 64, 32, (16, 32)
    x = torch.randn(t, h, generator=g) * 3  # gate/up values past swigluoai's clamp at 7
    p = _experts(e, h, i, block, g)
    b13, b2 = torch.randn(e, 2 * i, generator=g) * 2, torch.randn(e, h, generator=g)
    w, ids = _routing(t, e, k, g)
    kw = {"activation": activation, "swiglu_alpha": 1.5, "swiglu_limit": 4.0}
    ref = fused_moe_fp8_ref(x, *p.values(), block, w, ids, b13, b2, **kw)
    _close(_run(p, block, x, w, ids, device, w13_bias=b13.to(device), w2_bias=b2.to(device), **kw), ref)
    assert (fused_moe_fp8_ref(x, *p.values(), block, w, ids, **kw) - ref).abs().max() > 0.1


def test_act_quant_kernel_matches_reference(device):
    """The fused activation + quantization: values within one fp8 step of the reference's
    (Triton's exp is not torch's, so a value at a rounding midpoint may go either way)."""
    g = torch.Generator().manual_seed(2)
    gate_up = torch.randn(6, 2 * 80, generator=g) * 3
    q, s = act_quant_fp8_triton(gate_up.to(device), 32)
    assert q.shape == (6, 80) and s.shape == (6, 3)
    gate, up = gate_up.chunk(2, dim=-1)
    want = quant_dequant_rows(torch.nn.functional.silu(gate) * up, 32)
    got = q.cpu().float() * s.cpu().repeat_interleave(32, dim=1)[:, :80]
    torch.testing.assert_close(got, want, rtol=0.07, atol=1e-6)
    assert (got == want).float().mean() > 0.95


def test_fp8_moe_skips_other_ranks_experts(device):
    """Expert parallelism: ids -1 contribute nothing."""
    g = torch.Generator().manual_seed(3)
    t, e, k, h, i, block = 15, 4, 3, 32, 32, (16, 32)
    x = torch.randn(t, h, generator=g)
    p = _experts(e, h, i, block, g)
    w, ids = _routing(t, 2 * e, k, g)
    local = torch.where(ids < e, ids, -1)
    expected = fused_moe_fp8_ref(x, *p.values(), block, torch.where(ids < e, w, 0.0), torch.where(ids < e, ids, 0))
    _close(_run(p, block, x, w, local, device, skip_invalid_ids=True), expected)


def test_fp8_moe_tensor_parallel_slices_sum_to_the_whole(device):
    """Two ranks each hold gate/up rows [r I/2, (r+1) I/2) and those columns of down, with
    the scale blocks that cover them: their partial sums add up to the whole layer."""
    g = torch.Generator().manual_seed(4)
    t, e, k, h, i, block = 9, 3, 2, 32, 64, (16, 32)
    x = torch.randn(t, h, generator=g)
    p = _experts(e, h, i, block, g)
    w, ids = _routing(t, e, k, g)
    whole = fused_moe_fp8_ref(x, *p.values(), block, w, ids)
    total = torch.zeros_like(whole)
    half = i // 2
    for r in range(2):
        rows = torch.cat([torch.arange(r * half, (r + 1) * half), torch.arange(i + r * half, i + (r + 1) * half)])
        srows = torch.cat([torch.arange(r * half // 16, (r + 1) * half // 16),
                           torch.arange((i + r * half) // 16, (i + (r + 1) * half) // 16)])
        part = {"w13": p["w13"][:, rows].contiguous(), "w13_scale": p["w13_scale"][:, srows].contiguous(),
                "w2": p["w2"][:, :, r * half:(r + 1) * half].contiguous(),
                "w2_scale": p["w2_scale"][:, :, r * half // 32:(r + 1) * half // 32].contiguous()}
        total += _run(part, block, x, w, ids, device)
    # each rank quantizes its own slice of the activation: groups of 32 within 32 columns
    # are the whole layer's groups, so the sum is the whole reference's
    _close(total, whole)


def test_fp8_moe_refusals(device):
    g = torch.Generator().manual_seed(5)
    x, (w, ids) = torch.randn(3, 32, generator=g), _routing(3, 2, 1, g)
    p = _experts(2, 32, 24, (16, 32), g)  # I = 24: the up rows start inside a 16-row block
    with pytest.raises(ValueError, match=r"intermediate size per rank 24 is not a multiple of .* b0=16"):
        _run(p, (16, 32), x, w, ids, device)
    p = _experts(2, 32, 32, (16, 32), g)
    with pytest.raises(ValueError, match=r"BLOCK_K=64.*weight block b1=32"):
        _run(p, (16, 32), x, w, ids, device, config={"BLOCK_K": 64})
    with pytest.raises(ValueError, match=r"w2 scales have shape \(2, 1, 1\).*needs float32 \(2, 2, 1\)"):
        _run({**p, "w2_scale": p["w2_scale"][:, :1].contiguous()}, (16, 32), x, w, ids, device)
    with pytest.raises(ValueError, match=r"w13 must be a 3-D float8_e4m3fn"):
        _run({**p, "w13": p["w13"].float()}, (16, 32), x, w, ids, device)
    with pytest.raises(ValueError, match=r"b1=24.*power of two"):
        _run(p, (16, 24), x, w, ids, device)
    assert _run(p, (16, 32), x[:0], w[:0], ids[:0], device).shape == (0, 32)


def _ref_on_used_experts(x, p, block, w, ids, **kw) -> torch.Tensor:
    """The reference over only the experts some token chose (256 dequantized experts of
    DeepSeek-V3 would take 45 GB in float32)."""
    used, local = torch.unique(ids, return_inverse=True)
    sub = {name: t[used] for name, t in p.items()}
    return fused_moe_fp8_ref(x.float(), *sub.values(), block, w, local.to(torch.int32), **kw)


def _random_fp8_experts(e: int, rows: int, cols: int, block, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random fp8 values and scales straight on the GPU, a few experts at a time."""
    q = torch.empty(e, rows, cols, dtype=torch.float8_e4m3fn, device="cuda")
    for e0 in range(0, e, 16):
        chunk = torch.randn(min(16, e - e0), rows, cols, device="cuda", generator=g) * 60
        q[e0:e0 + 16] = chunk.clamp(-448, 448).to(torch.float8_e4m3fn)
    nb = (-(-rows // block[0]), -(-cols // block[1]))
    s = torch.rand(e, *nb, device="cuda", generator=g) * 2e-4 + 1e-4
    return q, s


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("t", [1, 16, 256, 2048])
def test_fp8_moe_deepseek_v3_layer_on_the_gpu(t):
    """DeepSeek-V3's routed experts: hidden 7168, moe_intermediate 2048, 256 experts, top-8,
    block [128, 128], bf16 activations; against the float32 reference."""
    h, i, e, k, block = 7168, 2048, 256, 8, (128, 128)
    g = torch.Generator(device="cuda").manual_seed(0)
    w13, s13 = _random_fp8_experts(e, 2 * i, h, block, g)
    w2, s2 = _random_fp8_experts(e, h, i, block, g)
    p = {"w13": w13, "w13_scale": s13, "w2": w2, "w2_scale": s2}
    x = torch.randn(t, h, device="cuda", generator=g).bfloat16()
    ids = torch.stack([torch.randperm(e, device="cuda", generator=g)[:k] for _ in range(t)]).to(torch.int32)
    w = torch.rand(t, k, device="cuda", generator=g)
    out = fused_moe_fp8_triton(x, w13, s13, w2, s2, block, w, ids)
    assert out.dtype == torch.bfloat16 and out.shape == (t, h)
    if t > 8:  # a reference over every routed expert would dequantize up to 256: compare 8 tokens (<= 64)
        keep = torch.arange(0, t, t // 8, device="cuda")
        x, w, ids, out = x[keep], w[keep], ids[keep], out[keep]
    ref = _ref_on_used_experts(x, p, block, w, ids)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
