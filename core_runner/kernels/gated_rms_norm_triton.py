"""Gated RMSNorm in one kernel (Triton twin of ``layers.mamba2.GatedRMSNorm.forward`` for
groups that lie within a rank): h = y * silu(z) in fp32, normalised by the root mean square
of each group of ``group_size`` channels, rounded to z's dtype, times the weight in fp32,
rounded to the promotion of z's and the weight's dtypes (the torch code's order of
roundings). One program per (row, group); rows of y and z may be strided (z is a view
of the in_proj output), the last dim contiguous. The grid comes from host ints, so the
launch is safe inside CUDA graphs and the row count never recompiles."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_rows"])
def _gated_rms_norm_kernel(
    y_ptr, z_ptr, w_ptr, out_ptr, n_rows, s_y, s_z, C, G, eps, inv_g,
    BLOCK_G: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * G + tl.arange(0, BLOCK_G)
    m = tl.arange(0, BLOCK_G) < G
    y = tl.load(y_ptr + row * s_y + c, mask=m, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + row * s_z + c, mask=m, other=0.0).to(tl.float32)
    h = y * (z / (1.0 + tl.exp(-z)))
    rstd = tl.math.rsqrt(tl.sum(h * h, axis=0) * inv_g + eps)
    normed = (h * rstd).to(z_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * C + c, (w * normed).to(out_ptr.dtype.element_ty), mask=m)


def gated_rms_norm_triton(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, group_size: int,
                          eps: float) -> torch.Tensor:
    """y, z: [T, C] (any float dtypes, last dim contiguous); weight [C]; C a multiple of
    group_size. Returns a new contiguous [T, C] tensor."""
    if y.dim() != 2 or y.shape != z.shape or y.stride(-1) != 1 or z.stride(-1) != 1:
        raise ValueError(f"gated_rms_norm: y {tuple(y.shape)} and z {tuple(z.shape)} must be equal 2-D shapes "
                         "with a contiguous last dim")
    n_rows, C = z.shape
    if weight.shape != (C,) or C % group_size:
        raise ValueError(f"gated_rms_norm: weight {tuple(weight.shape)} / group_size {group_size} do not fit C={C}")
    out = torch.empty((n_rows, C), dtype=torch.promote_types(z.dtype, weight.dtype), device=z.device)
    if n_rows == 0:
        return out
    block = max(triton.next_power_of_2(group_size), 16)
    warps = 16 if block >= 8192 else 8 if block >= 2048 else 4
    _gated_rms_norm_kernel[(n_rows, C // group_size)](
        y, z, weight.contiguous(), out, n_rows, y.stride(0), z.stride(0), C, group_size, eps, 1.0 / group_size,
        BLOCK_G=block, num_warps=warps, enable_fp_fusion=False,
    )
    return out
