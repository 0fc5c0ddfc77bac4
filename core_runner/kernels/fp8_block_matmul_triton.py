"""Block-scaled fp8 matmul with dynamic per-token-group activation quantization (W8A8).

Torch reference: ``kernels/fp8_block_matmul.py`` (the maths is stated there). Chosen
over "bf16 x, W dequantized tile-wise" because it is what DeepSeek-V3 was trained and
evaluated with, and the fp8 x fp8 ``tl.dot`` runs on the H200's fp8 tensor cores at
twice the bf16 rate; the weights stay fp8 in memory either way.

Two launches:
- ``_group_quant_kernel``: program (row, group) reads b1 channels, writes their fp8
  values and one float32 scale (amax / 448, IEEE division as torch's).
- ``_matmul_kernel``: program (m tile, n tile) walks K one weight block (b1 columns) at a
  time: ``acc += dot(x_q, w_q^T) * x_s[:, None] * w_s[None, :]``. An n tile may cover
  several weight row blocks: each column reads the scale of its own block (n // b0).
  Partial last blocks along M, N and K are masked (zeros add nothing to the dot).

Limits: b1 must be a power of two >= 16 (the K tile is one weight block); fp8 ``tl.dot``
needs sm89+ on CUDA and K >= 32, so a block of 16 (the suite's tiny checkpoints) multiplies
its fp8 values in float32 (exact) instead. Interpreter (TRITON_INTERPRET=1): the fp8 dot is exact there, but
its float32 -> fp8 cast drops the carry when rounding up crosses a power of two (1.95
-> 1.0 instead of 2.0; triton 3.9), so interpreter tests of the quantization feed values
that need no rounding and the GPU test checks rounding.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_runner.kernels.fp8_block_matmul import MIN_SCALE
from core_runner.quantization.fp8 import FP8_MAX, expected_scale_shape


@triton.jit
def _round_e4m3(x):
    """``x`` (float32, |x| <= 448) rounded to the nearest float8 e4m3 value, ties to even,
    in float32 bits: the cast alone may go through float16 and round twice (151.99998 ->
    152.0 -> 160 instead of 144). Normal values keep 3 mantissa bits; below 2^-6 the grid
    is the subnormals' 2^-9."""
    bits = x.to(tl.int32, bitcast=True)
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) & -0x100000).to(tl.float32, bitcast=True)
    # the ulp of 1.5 * 2^14 is 2^-9: the add rounds |x| to that grid, ties to even; the sign
    # bit goes back on afterwards so that tiny negatives stay -0.0 as in torch's cast
    mag = (tl.abs(x) + 24576.0) - 24576.0
    sub = (mag.to(tl.int32, bitcast=True) | (bits & -0x80000000)).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(x) < 0.015625, sub, normal)


@triton.jit
def _group_quant_kernel(x_ptr, q_ptr, s_ptr, k, s_x, s_q, s_s, GROUP: tl.constexpr, FP8MAX: tl.constexpr,
                        MINS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    cols = g * GROUP + tl.arange(0, GROUP)
    mask = cols < k
    x = tl.load(x_ptr + row * s_x + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(x), axis=0), FP8MAX), MINS)
    q = _round_e4m3(tl.clamp(tl.math.div_rn(x, scale), -FP8MAX, FP8MAX))
    tl.store(q_ptr + row * s_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)  # exact: q is on the grid
    tl.store(s_ptr + row * s_s + g, scale)


@triton.jit
def _matmul_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, m, n, k,
                   s_xm, s_xsm, s_wn, s_wsn, s_ym,
                   B0: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    rmask, cmask = rows < m, cols < n
    rows64, cols64 = rows.to(tl.int64), cols.to(tl.int64)
    ks = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(0, tl.cdiv(k, BK)):
        kk = kb * BK + ks
        kmask = kk < k
        a = tl.load(x_ptr + rows64[:, None] * s_xm + kk[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        b = tl.load(w_ptr + cols64[None, :] * s_wn + kk[:, None], mask=cmask[None, :] & kmask[:, None], other=0.0)
        a_s = tl.load(xs_ptr + rows64 * s_xsm + kb, mask=rmask, other=0.0)
        b_s = tl.load(ws_ptr + (cols64 // B0) * s_wsn + kb, mask=cmask, other=0.0)
        if BK < 32:  # the fp8 tensor-core dot needs K >= 32 on sm90: small blocks go through float32 (exact)
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee") * a_s[:, None] * b_s[None, :]
        else:
            acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
    out = y_ptr + rows64[:, None] * s_ym + cols64[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


def _check_block(block: tuple[int, int]) -> None:
    b1 = block[1]
    if b1 < 16 or b1 & (b1 - 1):
        raise ValueError(f"fp8 block matmul: weight_block_size {list(block)} has b1={b1}; the Triton kernel needs "
                         "a power of two >= 16 along K (DeepSeek-V3 uses [128, 128])")


def per_token_group_quant_fp8_triton(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (unit stride along K) -> (x_q float8_e4m3fn [M, K], x_s float32 [M, ceil(K/group)])."""
    _check_block((1, group))
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"per-token-group quantization needs a 2-D x with unit stride along K, got shape "
                         f"{tuple(x.shape)} strides {x.stride()}")
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(m, triton.cdiv(k, group), dtype=torch.float32, device=x.device)
    if m and k:
        _group_quant_kernel[(m, s.shape[1])](x, q, s, k, x.stride(0), q.stride(0), s.stride(0), GROUP=group,
                                             FP8MAX=FP8_MAX, MINS=MIN_SCALE)
    return q, s


def fp8_block_matmul_triton(x_q: torch.Tensor, x_s: torch.Tensor, w_q: torch.Tensor, w_s: torch.Tensor,
                            block: tuple[int, int], out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """y [M, N] = dequant(x_q, x_s) @ dequant(w_q, w_s)^T, accumulated in float32."""
    _check_block(block)
    (m, k), (n, kw) = x_q.shape, w_q.shape
    if kw != k:
        raise ValueError(f"fp8 block matmul: x_q {tuple(x_q.shape)} and w_q {tuple(w_q.shape)} disagree on K")
    for name, t in (("x_q", x_q), ("w_q", w_q)):
        if t.dtype != torch.float8_e4m3fn or t.stride(-1) != 1:
            raise ValueError(f"fp8 block matmul: {name} must be float8_e4m3fn with unit stride along K, got "
                             f"{t.dtype} strides {t.stride()}")
    want = {"x_s": (m, triton.cdiv(k, block[1])), "w_s": expected_scale_shape((n, k), block)}
    for name, t in (("x_s", x_s), ("w_s", w_s)):
        if tuple(t.shape) != want[name] or t.dtype != torch.float32 or t.stride(-1) != 1:
            raise ValueError(f"fp8 block matmul: {name} has shape {tuple(t.shape)} dtype {t.dtype}; block "
                             f"{list(block)} needs float32 {want[name]} with unit stride")
    if x_q.is_cuda and torch.cuda.get_device_capability(x_q.device) < (8, 9):
        raise ValueError("fp8 block matmul: fp8 tl.dot needs compute capability >= 8.9 (Ada / Hopper), got "
                         f"{torch.cuda.get_device_capability(x_q.device)}")
    y = torch.empty(m, n, dtype=out_dtype, device=x_q.device)
    if m == 0 or n == 0:
        return y
    bm = 16 if m <= 16 else 64
    bn = 128 if n >= 128 else 32
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _matmul_kernel[grid](x_q, x_s, w_q, w_s, y, m, n, k, x_q.stride(0), x_s.stride(0), w_q.stride(0),
                         w_s.stride(0), y.stride(0), B0=block[0], BM=bm, BN=bn, BK=block[1])
    return y


def fp8_block_linear_triton(x: torch.Tensor, w_q: torch.Tensor, w_s: torch.Tensor,
                            block: tuple[int, int]) -> torch.Tensor:
    """x [..., K] -> [..., N] in x's dtype (the twin of ``fp8_block_linear_ref``)."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    x_q, x_s = per_token_group_quant_fp8_triton(rows, block[1])
    return fp8_block_matmul_triton(x_q, x_s, w_q, w_s, block, x.dtype).reshape(*x.shape[:-1], w_q.shape[0])
