"""silu(gate) * up for a fused [gate | up] input (Triton twin of ``layers.activation``).

Program (row, j) writes BLOCK outputs of one row. The rounding order is torch's for
``F.silu(gate) * up``: silu is computed in fp32 and rounded to the input dtype, then
the product is formed in fp32 and rounded again. The division is IEEE (``div_rn``) as
torch's, but Triton's exp is the fast ``ex2.approx`` form, a few fp32 ulps off torch's
``expf``, so a bf16 result can differ from torch's by one bf16 ulp in rare elements.

No argument depends on the row count and the grid comes from host ints, so batch-size
changes never recompile and the launch is safe inside CUDA graphs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, inter, s_x, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    src = x_ptr + row * s_x + cols
    gate = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + inter, mask=mask, other=0.0).to(tl.float32)
    silu = tl.math.div_rn(gate, 1.0 + tl.exp(-gate)).to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * inter + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2I] with a contiguous last dim -> new contiguous [..., I]."""
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"silu_mul needs an even last dim, got shape {tuple(x.shape)}")
    inter = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    rows = x.reshape(-1, 2 * inter) if x.dim() != 2 else x  # a view when x is contiguous
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    n_rows = rows.shape[0]
    if n_rows == 0 or inter == 0:
        return out
    block = min(max(triton.next_power_of_2(inter), 16), 1024)
    grid = (n_rows, triton.cdiv(inter, block))
    _silu_mul_kernel[grid](rows, out, inter, rows.stride(0), BLOCK=block, num_warps=4, enable_fp_fusion=False)
    return out
