"""Block-scaled fp8 matmul, torch reference (twin of ``fp8_block_matmul_triton``).

W8A8 as DeepSeek-V3 runs it: weights ``w_q`` [N, K] float8_e4m3fn with ``w_s`` float32
[ceil(N/b0), ceil(K/b1)] (the checkpoint's ``weight_scale_inv``); activations quantized
dynamically per token and per group of b1 channels,

    x_s[m, g] = max_{k in group g} |x[m, k]| / 448,   x_q[m, k] = fp8(x[m, k] / x_s[m, k // b1])

and then

    y[m, n] = sum_k x_q[m, k] x_s[m, k // b1] * w_q[n, k] w_s[n // b0, k // b1].

Because the activation groups line up with the weight blocks along K, the kernel can take
each K block's fp8 x fp8 dot product once and scale it by x_s[m, g] * w_s[n // b0, g].
"""
from __future__ import annotations

import torch

from core_runner.quantization.fp8 import FP8_MAX, dequantize_fp8_block, expand_block_scale

MIN_SCALE = 1e-10  # an all-zero group gets this scale (0 / 0 would store NaNs)


def per_token_group_quant_fp8_ref(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (x_q float8_e4m3fn [M, K], x_s float32 [M, ceil(K / group)]); the last
    group may be partial."""
    m, k = x.shape
    groups = -(-k // group)
    padded = torch.zeros(m, groups * group, dtype=torch.float32, device=x.device)
    padded[:, :k] = x.float()
    amax = padded.view(m, groups, group).abs().amax(-1)
    # a tensor divisor: torch divides by a Python scalar on CUDA as a multiplication by its
    # reciprocal, which is not the IEEE quotient the kernel (and the CPU) computes
    scale = (amax / torch.full_like(amax, FP8_MAX)).clamp(min=MIN_SCALE)
    full = scale.repeat_interleave(group, dim=1)[:, :k]
    return (x.float() / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def fp8_block_matmul_ref(x_q: torch.Tensor, x_s: torch.Tensor, w_q: torch.Tensor, w_s: torch.Tensor,
                         block: tuple[int, int], out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """y = dequant(x_q, x_s) @ dequant(w_q, w_s)^T in float32, rounded once to out_dtype."""
    x = x_q.float() * expand_block_scale(x_s, tuple(x_q.shape), (1, block[1]))
    w = dequantize_fp8_block(w_q, w_s, block, torch.float32, "w_q")
    return (x @ w.T).to(out_dtype)


def fp8_block_linear_ref(x: torch.Tensor, w_q: torch.Tensor, w_s: torch.Tensor,
                         block: tuple[int, int]) -> torch.Tensor:
    """x [..., K] -> [..., N] in x's dtype: dynamic activation quantization, then the matmul."""
    rows = x.reshape(-1, x.shape[-1])
    x_q, x_s = per_token_group_quant_fp8_ref(rows, block[1])
    return fp8_block_matmul_ref(x_q, x_s, w_q, w_s, block, x.dtype).reshape(*x.shape[:-1], w_q.shape[0])
