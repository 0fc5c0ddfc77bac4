"""Fused MoE with fp8 experts: a W8A8 grouped GEMM with per-expert block scales.

The fp8 twin of ``fused_moe_triton`` (torch reference: ``layers.fused_moe_fp8.fused_moe_fp8_ref``).
Weights stay float8_e4m3fn: ``w13`` [E, 2I, H] and ``w2`` [E, H, I] with their
``weight_scale_inv`` grids [E, ceil(rows / b0), ceil(cols / b1)] for ``block`` [b0, b1]
(DeepSeek-V3's format; compressed-tensors' per-channel / per-tensor scales arrive as
the [1, 128] grid ``quantization.construction`` gives them). Activations are quantized
per token and group of b1 channels on the fly (amax / 448, as ``fp8_block_matmul``),
so every K block of a dot is fp8 x fp8 scaled once by x_s[row, g] * w_s[e, n // b0, g].

Same sorted-pair / expert-tile layout as the bf16 kernel (``align_pairs``, imported from
there): pairs (token, expert) sorted by expert and padded to BLOCK_M per expert, one
expert per tile, ids outside [0, E) (expert parallelism's -1) in no tile.

Three launches between ``align_pairs`` and the final sum over top_k:
- the hidden states are quantized once per token (``per_token_group_quant_fp8_triton``),
  not once per (token, expert) pair: the gate_up GEMM gathers row pair // top_k;
- gate_up GEMM -> [pairs, 2I] in the hidden dtype (bias added in fp32 before the store);
- ``_act_quant_kernel``: the activation (silu(gate) * up, or gpt-oss's clamped SwiGLU) in
  float32 from the stored gate_up, quantized per group of b1 in the same pass (the
  activation never goes to memory in bf16: one rounding fewer than the bf16 path);
- down GEMM, bias and router weight applied to the fp32 accumulator.

Limits: BLOCK_K is the weight block b1 (a power of two >= 16; blocks under 32 multiply
their fp8 values in float32, exact, as the dense kernel does); the up part starts at row
I, which must be a multiple of b0 (a tensor-parallel split of the intermediate size that
cuts a block is refused by name here; the loader keeps such a layer dense). fp8 ``tl.dot``
needs compute capability 8.9+.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_runner.kernels.fp8_block_matmul import MIN_SCALE
from core_runner.kernels.fp8_block_matmul_triton import _check_block, _round_e4m3, per_token_group_quant_fp8_triton
from core_runner.kernels.fused_moe_triton import SWIGLU_ALPHA, SWIGLU_LIMIT, align_pairs, gemm_config
from core_runner.quantization.fp8 import FP8_MAX, expected_scale_shape

FP8 = torch.float8_e4m3fn


@triton.jit(do_not_specialize=["num_pairs"])
def _moe_fp8_gemm_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, w_ptr, bias_ptr, sorted_ptr, block_expert_ptr,
    N, K, num_pairs,
    s_am, s_asm, s_be, s_bn, s_bse, s_bsn, s_cm, s_bias_e,
    A_ROW_DIV: tl.constexpr, MUL_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, B0: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + rows)
    row_ok = pair < num_pairs
    a_row = (pair // A_ROW_DIV).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    cols64 = cols.to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    e64 = expert.to(tl.int64)
    a_base = a_ptr + a_row[:, None] * s_am
    as_base = as_ptr + a_row * s_asm
    b_base = b_ptr + e64 * s_be + cols64[None, :] * s_bn
    # a tile of BLOCK_N columns may span several row blocks of the weight: each column
    # reads the scale of its own block
    bs_base = bs_ptr + e64 * s_bse + (cols64 // B0) * s_bsn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k = kb * BLOCK_K + kk
        k_ok = k < K
        a = tl.load(a_base + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_base + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        a_s = tl.load(as_base + kb, mask=row_ok, other=0.0)
        b_s = tl.load(bs_base + kb, mask=col_ok, other=0.0)
        if BLOCK_K < 32:  # the fp8 tensor-core dot needs K >= 32: small blocks go through float32 (exact)
            d = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        else:
            d = tl.dot(a, b)
        acc += d * a_s[:, None] * b_s[None, :]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + e64 * s_bias_e + cols, mask=col_ok, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    if MUL_WEIGHT:
        w = tl.load(w_ptr + pair, mask=row_ok, other=0.0)
        acc = acc * w[:, None]
    c_off = pair.to(tl.int64)[:, None] * s_cm + cols64[None, :]
    tl.store(c_ptr + c_off, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _act_quant_kernel(x_ptr, q_ptr, s_ptr, inter, s_x, s_q, s_s, alpha, limit, SWIGLU: tl.constexpr,
                      GROUP: tl.constexpr, FP8MAX: tl.constexpr, MINS: tl.constexpr):
    """Program (row, group): GROUP activations of one row of [gate | up] in float32, then
    their fp8 values and one scale (the per-token-group quantizer's maths)."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    cols = g * GROUP + tl.arange(0, GROUP)
    mask = cols < inter
    src = x_ptr + row * s_x + cols
    gate = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + inter, mask=mask, other=0.0).to(tl.float32)
    if SWIGLU:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        act = (up + 1.0) * tl.math.div_rn(gate, 1.0 + tl.exp(-gate * alpha))
    else:
        act = tl.math.div_rn(gate, 1.0 + tl.exp(-gate)) * up
    act = tl.where(mask, act, 0.0)
    scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(act), axis=0), FP8MAX), MINS)
    q = _round_e4m3(tl.clamp(tl.math.div_rn(act, scale), -FP8MAX, FP8MAX))
    tl.store(q_ptr + row * s_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * s_s + g, scale)


def act_quant_fp8_triton(gate_up: torch.Tensor, group: int, activation: str = "silu",
                         swiglu_alpha: float = SWIGLU_ALPHA,
                         swiglu_limit: float = SWIGLU_LIMIT) -> tuple[torch.Tensor, torch.Tensor]:
    """gate_up [rows, 2I] -> (act_q float8_e4m3fn [rows, I], act_s float32 [rows, ceil(I / group)])."""
    _check_block((1, group))
    if gate_up.dim() != 2 or gate_up.shape[-1] % 2 or gate_up.stride(-1) != 1:
        raise ValueError(f"activation quantization needs [rows, 2I] with unit stride, got shape "
                         f"{tuple(gate_up.shape)} strides {gate_up.stride()}")
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    q = torch.empty(rows, inter, dtype=FP8, device=gate_up.device)
    s = torch.empty(rows, triton.cdiv(inter, group), dtype=torch.float32, device=gate_up.device)
    if rows and inter:
        _act_quant_kernel[(rows, s.shape[1])](gate_up, q, s, inter, gate_up.stride(0), q.stride(0), s.stride(0),
                                              float(swiglu_alpha), float(swiglu_limit),
                                              SWIGLU=activation == "swigluoai", GROUP=group, FP8MAX=FP8_MAX,
                                              MINS=MIN_SCALE)
    return q, s


def fp8_gemm_config(num_pairs: int, device: torch.device, block: tuple[int, int], block_m: int | None = None,
                    config: dict | None = None, *, num_experts: int) -> dict:
    """The tiles of a ``fused_moe_fp8_triton`` call: the bf16 kernel's choice for 1-byte
    inputs with BLOCK_K = b1 (one weight block per K step, so each step needs one scale)."""
    if config and config.get("BLOCK_K", block[1]) != block[1]:
        raise ValueError(f"config BLOCK_K={config['BLOCK_K']}: the fp8 MoE kernel's K tile is the weight block "
                         f"b1={block[1]} (weight_block_size {list(block)})")
    cfg = gemm_config(num_pairs, device, block_m, config, num_experts=num_experts, elem_bytes=1)
    cfg["BLOCK_K"] = block[1]
    return cfg


def _check_expert_weight(name: str, w: torch.Tensor, s: torch.Tensor, block: tuple[int, int]) -> None:
    if w.dtype != FP8 or w.dim() != 3 or w.stride(-1) != 1:
        raise ValueError(f"fp8 MoE: {name} must be a 3-D float8_e4m3fn [E, N, K] with unit stride along K, got "
                         f"{w.dtype} shape {tuple(w.shape)} strides {w.stride()}")
    want = expected_scale_shape(tuple(w.shape), block)
    if tuple(s.shape) != want or s.dtype != torch.float32 or s.stride(-1) != 1:
        raise ValueError(f"fp8 MoE: {name} scales have shape {tuple(s.shape)} dtype {s.dtype}; weight "
                         f"{tuple(w.shape)} with weight_block_size {list(block)} needs float32 {want} with unit "
                         "stride")


def _launch(a, a_s, b, b_s, c, weights, sorted_pairs, block_expert, num_pairs, a_row_div, mul_weight, bias,
            block, cfg):
    n_out, k_in = b.shape[1], b.shape[2]
    if bias is not None and (bias.shape != (b.shape[0], n_out) or bias.stride(1) != 1):
        raise ValueError(f"expert bias has shape {tuple(bias.shape)}, expected ({b.shape[0]}, {n_out}) contiguous")
    grid = (block_expert.shape[0], triton.cdiv(n_out, cfg["BLOCK_N"]))
    _moe_fp8_gemm_kernel[grid](
        a, a_s, b, b_s, c, weights, b if bias is None else bias, sorted_pairs, block_expert,
        n_out, k_in, num_pairs,
        a.stride(0), a_s.stride(0), b.stride(0), b.stride(1), b_s.stride(0), b_s.stride(1), c.stride(0),
        0 if bias is None else bias.stride(0),
        A_ROW_DIV=a_row_div, MUL_WEIGHT=mul_weight, HAS_BIAS=bias is not None, B0=block[0],
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )


def fused_moe_fp8_triton(
    hidden: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
    block: tuple[int, int], topk_weights: torch.Tensor, topk_ids: torch.Tensor, block_m: int | None = None,
    skip_invalid_ids: bool = False, config: dict | None = None, w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None, activation: str = "silu", swiglu_alpha: float = SWIGLU_ALPHA,
    swiglu_limit: float = SWIGLU_LIMIT,
) -> torch.Tensor:
    """hidden [T, H] (bf16 / fp16 / fp32); fp8 ``w13`` [E, 2I, H] and ``w2`` [E, H, I] with
    their block scales for ``block`` [b0, b1]; topk_weights / topk_ids [T, top_k]. Returns
    sum_k w_k * expert_k(hidden) as [T, H] in hidden's dtype. The other arguments are
    ``fused_moe_triton``'s; ``config`` may not change BLOCK_K (it is b1)."""
    if activation not in ("silu", "swigluoai"):
        raise ValueError(f"activation={activation!r} is not supported: expected 'silu' or 'swigluoai'")
    block = (int(block[0]), int(block[1]))
    _check_block(block)
    _check_expert_weight("w13", w13, w13_scale, block)
    _check_expert_weight("w2", w2, w2_scale, block)
    num_tokens, hidden_size = hidden.shape
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    if w2.shape != (num_experts, hidden_size, inter) or w13.shape[2] != hidden_size or two_i % 2:
        raise ValueError(f"expert weights {tuple(w13.shape)} / {tuple(w2.shape)} do not fit hidden {hidden_size}")
    if inter % block[0]:
        raise ValueError(f"fp8 MoE: intermediate size per rank {inter} is not a multiple of the weight block's b0="
                         f"{block[0]} (weight_block_size {list(block)}): the up rows must start on a scale block; "
                         "pick a tensor-parallel size that splits the intermediate size into whole blocks")
    if hidden.is_cuda and torch.cuda.get_device_capability(hidden.device) < (8, 9):
        raise ValueError("fp8 MoE: fp8 tl.dot needs compute capability >= 8.9 (Ada / Hopper), got "
                         f"{torch.cuda.get_device_capability(hidden.device)}")
    if num_tokens == 0:
        return hidden.new_zeros(0, hidden_size)
    top_k = topk_ids.shape[1]
    num_pairs = num_tokens * top_k
    cfg = fp8_gemm_config(num_pairs, hidden.device, block, block_m, config, num_experts=num_experts)
    sorted_pairs, block_expert = align_pairs(topk_ids, num_experts, cfg["BLOCK_M"])
    x_q, x_s = per_token_group_quant_fp8_triton(hidden if hidden.stride(-1) == 1 else hidden.contiguous(), block[1])
    weights = topk_weights.reshape(-1).float().contiguous()
    gate_up = torch.empty((num_pairs, two_i), dtype=hidden.dtype, device=hidden.device)
    _launch(x_q, x_s, w13, w13_scale, gate_up, weights, sorted_pairs, block_expert, num_pairs, top_k, False,
            w13_bias, block, cfg)
    # rows of skipped pairs are never written: garbage there is quantized and never read
    act_q, act_s = act_quant_fp8_triton(gate_up, block[1], activation, swiglu_alpha, swiglu_limit)
    alloc = torch.zeros if skip_invalid_ids else torch.empty
    down = alloc((num_pairs, hidden_size), dtype=hidden.dtype, device=hidden.device)
    _launch(act_q, act_s, w2, w2_scale, down, weights, sorted_pairs, block_expert, num_pairs, 1, True, w2_bias,
            block, cfg)
    return down.view(num_tokens, top_k, hidden_size).sum(dim=1, dtype=torch.float32).to(hidden.dtype)
