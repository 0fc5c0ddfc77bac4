"""RMSNorm with an optional fused residual add (Triton twin of ``layers.norm.RMSNorm``,
and with ``gemma=True`` of ``layers.norm.GemmaRMSNorm``).

A "row" is one normalised vector: a token of a 2-D ``[T, H]`` input, or one head of a
3-D ``[T, heads, D]`` input (the per-head q/k norms). Rows may be strided, e.g. views of
a fused qkv output, so row r sits at ``(r // heads) * stride0 + (r % heads) * stride1``
and only the last dim must be contiguous. For small D one program takes several rows.

Numerics follow the torch reference step by step: the residual add is done in fp32 and
rounded to the input dtype (as torch's bf16 add does), the normalised value is computed
in fp32, rounded to the input dtype, then multiplied by the weight in fp32 and rounded
to the output dtype (the promotion of input and weight dtypes, as ``weight * x`` gives).
Only the order of the sum of squares differs from torch. Gemma's variant keeps the
normalised value in fp32, scales it by (1 + weight) in fp32 and rounds once, to the
input dtype (transformers' Gemma RMSNorm).

The row count is not specialised on and the grid comes from host ints, so batch-size
changes never recompile and the launch is safe inside CUDA graphs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_D = 65536  # one tile per row; no model comes near this


@triton.jit(do_not_specialize=["n_rows"])
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, res_out_ptr,
    n_rows, heads, D,
    s_x0, s_x1, s_r0, s_r1,
    eps, inv_d,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_RES: tl.constexpr,
    GEMMA: tl.constexpr,
):
    rows32 = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # n_rows < 2**31
    d = tl.arange(0, BLOCK_D)
    mask = (rows32 < n_rows)[:, None] & (d < D)[None, :]
    tok = (rows32 // heads).to(tl.int64)  # 32-bit division, 64-bit addresses
    head = (rows32 % heads).to(tl.int64)
    rows = rows32.to(tl.int64)
    x = tl.load(x_ptr + (tok * s_x0 + head * s_x1)[:, None] + d[None, :], mask=mask, other=0.0)
    dst = rows[:, None] * D + d[None, :]  # outputs are contiguous [n_rows, D]
    if HAS_RES:
        r = tl.load(r_ptr + (tok * s_r0 + head * s_r1)[:, None] + d[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + dst, x, mask=mask)
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=1) * inv_d  # torch's CUDA mean: sum * (1 / D)
    rstd = tl.math.rsqrt(mean_sq + eps)
    w = tl.load(w_ptr + d, mask=d < D, other=0.0).to(tl.float32)
    if GEMMA:
        y = (xf * rstd[:, None]) * (1.0 + w[None, :])
    else:
        y = (xf * rstd[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32) * w[None, :]
    tl.store(out_ptr + dst, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch_config(D: int) -> tuple[int, int, int]:
    """(BLOCK_D, ROWS, num_warps): depends on D only, never on the row count."""
    block_d = max(triton.next_power_of_2(D), 16)
    rows = max(1, min(16, 2048 // block_d))
    tile = rows * block_d
    num_warps = 16 if tile >= 8192 else 8 if tile >= 2048 else 4
    return block_d, rows, num_warps


def _row_strides(t: torch.Tensor) -> tuple[int, int]:
    if t.stride(-1) != 1:
        raise ValueError("rms_norm needs a contiguous last dim")
    return (t.stride(0), 0) if t.dim() == 2 else (t.stride(0), t.stride(1))


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, gemma: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x: [T, H] or [T, heads, D] with a contiguous last dim (rows may be strided);
    weight: [D]; residual: None or x's shape and dtype. Returns a new contiguous
    ``out`` or ``(out, x + residual)``; the inputs are never written. ``gemma``: scale by
    (1 + weight), the output in x's dtype (``GemmaRMSNorm``)."""
    if x.dim() not in (2, 3):
        raise ValueError(f"rms_norm expects a 2-D or 3-D input, got shape {tuple(x.shape)}")
    D = x.shape[-1]
    if D > MAX_D or weight.shape != (D,):
        raise ValueError(f"weight shape {tuple(weight.shape)} / last dim {D} not supported")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError("residual must have x's shape and dtype")
    weight = weight.contiguous()
    out_dtype = x.dtype if gemma else torch.promote_types(x.dtype, weight.dtype)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    res_out = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else out
    heads = 1 if x.dim() == 2 else x.shape[1]
    n_rows = x.shape[0] * heads
    if n_rows == 0:
        return out if residual is None else (out, res_out)
    s_x0, s_x1 = _row_strides(x)
    s_r0, s_r1 = _row_strides(residual) if residual is not None else (0, 0)
    block_d, rows, num_warps = _launch_config(D)
    _rms_norm_kernel[(triton.cdiv(n_rows, rows),)](
        x, residual if residual is not None else x, weight, out, res_out,
        n_rows, heads, D,
        s_x0, s_x1, s_r0, s_r1,
        eps, 1.0 / D,
        ROWS=rows, BLOCK_D=block_d, HAS_RES=residual is not None, GEMMA=gemma,
        num_warps=num_warps, enable_fp_fusion=False,
    )
    return out if residual is None else (out, res_out)
