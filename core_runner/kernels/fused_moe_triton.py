"""Fused MoE: a grouped GEMM over token-expert pairs sorted by expert (Triton twin of
``fused_moe_ref``).

Alignment. The T * top_k (token, expert) pairs are sorted by expert and each expert's
run is padded to a multiple of BLOCK_M with a sentinel (T * top_k), so every tile of
BLOCK_M sorted pairs belongs to one expert. ``moe_align`` builds, with device ops only
(no host reads, so a CUDA graph can capture it; on CUDA ``moe_align_triton`` builds the
same in three launches, ``align_pairs`` picks):
  sorted_pairs [max_padded]   pair index (token * top_k + k) or the sentinel
  block_expert [max_blocks]   the expert of each tile, -1 for the unused tail
where max_padded = T * top_k + E * (BLOCK_M - 1) bounds the padded length from host
ints alone; programs of unused tiles return at once. A pair whose id is outside [0, E)
(expert parallelism marks other ranks' experts -1) is left out of every tile, so it
contributes nothing.

GEMMs. One launch computes gate_up for every pair (A row = hidden[pair // top_k],
B = w13[expert]), the activation runs in its own elementwise kernel (silu(gate) * up in
the silu_mul kernel; gpt-oss's clamped SwiGLU, "swigluoai", in ``_swigluoai_kernel``
here; or, with ``fuse_activation``, silu(gate) * up in the first GEMM's epilogue from a
gate and an up accumulator: ``SILU_GATE_UP``), one launch computes down (A row =
act[pair], B = w2[expert]) and scales each row by its router weight; the top_k rows of
a token are then summed. Each program owns one (tile of BLOCK_M pairs, BLOCK_N output
columns) and loops over K, loading A rows by gather and B as [BLOCK_K, BLOCK_N] of the
expert's row-major [N, K] weight. With biases
(``HAS_BIAS``) the program adds its expert's bias row to the fp32 accumulator after the
K loop, before the router weight (torch's ``F.linear(x, w, b) * weight``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_runner.kernels.moe_align_triton import moe_align_triton
from core_runner.kernels.silu_mul_triton import silu_mul_triton

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # gpt-oss's (layers.fused_moe has the same defaults)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids: [T, top_k] -> (sorted_pairs int32 [max_padded], block_expert int32 [max_blocks]);
    pairs with an id outside [0, num_experts) are in no tile."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    max_padded = n + num_experts * (block_m - 1)
    max_padded = triton.cdiv(max_padded, block_m) * block_m
    # skipped pairs get bucket num_experts: they sort last and are written to a scratch
    # slot past the end, which is cut off
    bucket = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, bucket, torch.ones_like(bucket))
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m
    pad_end = padded.cumsum(0)
    pad_start = torch.cat([pad_end - padded, pad_end.new_full((1,), max_padded)])
    start = counts.cumsum(0) - counts
    # pair indices grouped by expert; 16-bit keys take 2 radix passes on CUDA where int64
    # keys take 8 (8 sort kernels a layer, 1.2 ms of a DeepSeek-V2-Lite decode step)
    keys = bucket.to(torch.int16) if num_experts < 2**15 - 1 else bucket
    order = torch.sort(keys, stable=True).indices
    bucket_sorted = bucket[order]
    rank = torch.arange(n, device=device) - start[bucket_sorted]
    dest = torch.where(bucket_sorted < num_experts, pad_start[bucket_sorted] + rank, max_padded)
    sorted_pairs = torch.full((max_padded + 1,), n, dtype=torch.int32, device=device)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    tile_start = torch.arange(0, max_padded, block_m, device=device)
    block_expert = torch.searchsorted(pad_end, tile_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return sorted_pairs[:max_padded], block_expert


def align_pairs(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``moe_align``'s outputs: from ``moe_align_triton`` on CUDA (three launches where the
    torch code takes ~40 small kernels a layer), from the torch code elsewhere (its reference,
    cheaper than three interpreted launches on the CPU)."""
    if topk_ids.is_cuda:
        return moe_align_triton(topk_ids, num_experts, block_m)
    return moe_align(topk_ids, num_experts, block_m)


@triton.jit(do_not_specialize=["num_pairs"])
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, w_ptr, bias_ptr, sorted_ptr, block_expert_ptr,
    N, K, num_pairs,
    s_am, s_ak, s_be, s_bn, s_bk, s_cm, s_cn, s_bias_e,
    A_ROW_DIV: tl.constexpr, MUL_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, SILU_GATE_UP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
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
    kk = tl.arange(0, BLOCK_K)
    a_base = a_ptr + a_row[:, None] * s_am
    b_base = b_ptr + expert.to(tl.int64) * s_be + cols[None, :].to(tl.int64) * s_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # SILU_GATE_UP only (else unused, removed)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + kk) < K
        a = tl.load(a_base + (k0 + kk)[None, :] * s_ak, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_base + (k0 + kk)[:, None] * s_bk, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc += tl.dot(a, b.to(a.dtype), input_precision=DOT_PRECISION)
        if SILU_GATE_UP:  # the up row of each gate row: N rows further down the expert's weight
            b = tl.load(b_base + N * s_bn + (k0 + kk)[:, None] * s_bk, mask=k_ok[:, None] & col_ok[None, :],
                        other=0.0)
            acc_up += tl.dot(a, b.to(a.dtype), input_precision=DOT_PRECISION)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + expert.to(tl.int64) * s_bias_e + cols, mask=col_ok, other=0.0)
        acc += bias.to(tl.float32)[None, :]
        if SILU_GATE_UP:
            bias = tl.load(bias_ptr + expert.to(tl.int64) * s_bias_e + N + cols, mask=col_ok, other=0.0)
            acc_up += bias.to(tl.float32)[None, :]
    if SILU_GATE_UP:
        # rounded where the unfused path rounds (gate and up stored in the output dtype, silu
        # rounded, then the product), so both paths give the same values
        out_ty = c_ptr.dtype.element_ty
        gate = acc.to(out_ty).to(tl.float32)
        silu = tl.math.div_rn(gate, 1.0 + tl.exp(-gate)).to(out_ty).to(tl.float32)
        acc = silu * acc_up.to(out_ty).to(tl.float32)
    if MUL_WEIGHT:
        w = tl.load(w_ptr + pair, mask=row_ok, other=0.0)
        acc = acc * w[:, None]
    c_off = pair.to(tl.int64)[:, None] * s_cm + cols[None, :] * s_cn
    tl.store(c_ptr + c_off, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _swigluoai_kernel(x_ptr, out_ptr, inter, s_x, alpha, limit, BLOCK: tl.constexpr):
    """Program (row, j): BLOCK outputs of one row of [gate | up], all in fp32, one rounding."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    src = x_ptr + row * s_x + cols
    gate = tl.minimum(tl.load(src, mask=mask, other=0.0).to(tl.float32), limit)
    up = tl.load(src + inter, mask=mask, other=0.0).to(tl.float32)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    glu = tl.math.div_rn(gate, 1.0 + tl.exp(-gate * alpha))  # gate * sigmoid(alpha * gate)
    tl.store(out_ptr + row * inter + cols, ((up + 1.0) * glu).to(out_ptr.dtype.element_ty), mask=mask)


def swigluoai_triton(x: torch.Tensor, alpha: float = SWIGLU_ALPHA, limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """x: [rows, 2I] = [gate | up] (contiguous last dim) -> [rows, I]: the Triton twin of
    ``layers.fused_moe.swigluoai_ref`` (fp32 math; in bf16 it rounds once where torch
    rounds after every op, so the two may differ by a bf16 ulp)."""
    if x.dim() != 2 or x.shape[-1] % 2:
        raise ValueError(f"swigluoai needs [rows, 2I], got shape {tuple(x.shape)}")
    rows = x if x.stride(-1) == 1 else x.contiguous()
    inter = rows.shape[-1] // 2
    out = torch.empty((rows.shape[0], inter), dtype=x.dtype, device=x.device)
    if rows.shape[0] == 0 or inter == 0:
        return out
    block = min(max(triton.next_power_of_2(inter), 16), 1024)
    grid = (rows.shape[0], triton.cdiv(inter, block))
    _swigluoai_kernel[grid](rows, out, inter, rows.stride(0), float(alpha), float(limit), BLOCK=block, num_warps=4,
                            enable_fp_fusion=False)
    return out


GEMM_CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")


def gemm_config(num_pairs: int, device: torch.device, block_m: int | None = None, config: dict | None = None, *,
                num_experts: int, elem_bytes: int = 2) -> dict:
    """The tile settings a ``fused_moe_triton`` call with these arguments launches with.

    Chosen by the rows an expert gets on average, as measured on the H200 at the DeepSeek-
    V2-Lite layer (64 experts x 1408, bf16; ``benchmarks/moe_sweep.py``, decode sizes timed
    from a CUDA graph; benchmarks/RESULTS.md): few rows waste less padding in narrow tiles,
    many rows reuse each weight tile over more rows. 256 tokens: M32 N128 K128 0.41 ms (M64
    N64 K32 0.90 eager); 1024: M128 N128 K64 8 warps 0.57 ms (M64 N64 K64 0.67); 8192: the
    same tile 2.67 ms (M64 N64 K32 5.04). 4-byte inputs keep narrower tiles, which fit
    shared memory in three stages."""
    rows = num_pairs / max(num_experts, 1)
    wide = elem_bytes <= 2
    if num_pairs <= 64 * 16 or rows <= 16:
        cfg = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3}
    elif rows <= 48:
        cfg = ({"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2} if wide
               else {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3})
    elif wide:
        cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}
    else:
        cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}
    if device.type != "cuda":
        cfg["num_stages"] = 1
    if config:
        unknown = sorted(set(config) - set(GEMM_CONFIG_KEYS))
        if unknown:
            raise ValueError(f"config keys {unknown} are unknown: expected some of {GEMM_CONFIG_KEYS}")
        if block_m is not None and config.get("BLOCK_M", block_m) != block_m:
            raise ValueError(f"block_m={block_m} and config BLOCK_M={config['BLOCK_M']} disagree: give one")
        cfg.update(config)
    if block_m is not None:
        cfg["BLOCK_M"] = block_m
    return cfg


def _launch(a, b, c, weights, sorted_pairs, block_expert, num_pairs, a_row_div, mul_weight, bias, cfg,
            silu_gate_up=False):
    n_rows, k_in = b.shape[1], b.shape[2]
    n_out = n_rows // 2 if silu_gate_up else n_rows  # silu_gate_up: b is [gate | up], c gets silu(gate) * up
    grid = (block_expert.shape[0], triton.cdiv(n_out, cfg["BLOCK_N"]))
    if bias is not None and (bias.shape != (b.shape[0], n_rows) or bias.stride(1) != 1):
        raise ValueError(f"expert bias has shape {tuple(bias.shape)}, expected ({b.shape[0]}, {n_rows}) contiguous")
    _moe_gemm_kernel[grid](
        a, b, c, weights, b if bias is None else bias, sorted_pairs, block_expert,
        n_out, k_in, num_pairs,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), c.stride(0), c.stride(1),
        0 if bias is None else bias.stride(0),
        A_ROW_DIV=a_row_div, MUL_WEIGHT=mul_weight, HAS_BIAS=bias is not None, SILU_GATE_UP=silu_gate_up,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )


def fused_moe_triton(
    hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
    topk_ids: torch.Tensor, block_m: int | None = None, skip_invalid_ids: bool = False,
    config: dict | None = None, w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None,
    activation: str = "silu", swiglu_alpha: float = SWIGLU_ALPHA, swiglu_limit: float = SWIGLU_LIMIT,
    fuse_activation: bool = False,
) -> torch.Tensor:
    """hidden [T, H]; w13 [E, 2I, H] (gate rows then up rows); w2 [E, H, I];
    topk_weights / topk_ids [T, top_k]. Returns sum_k w_k * expert_k(hidden) as [T, H].
    ``skip_invalid_ids``: ids outside [0, E) may occur (expert parallelism marks other
    ranks' experts -1) and contribute nothing; their rows start at zero, which costs a
    fill that a layer whose ids are all valid does not pay. ``config`` replaces any of the
    default tile settings ``GEMM_CONFIG_KEYS`` (tile sweeps: benchmarks/moe_sweep.py);
    ``block_m`` is the same as ``config={"BLOCK_M": block_m}``. BLOCK_* must be powers of
    two, at least 16. ``w13_bias`` [E, 2I] / ``w2_bias`` [E, H] are added per expert inside
    the two GEMMs; ``activation`` "silu" (silu(gate) * up) or "swigluoai" (gpt-oss:
    ``layers.fused_moe.swigluoai_ref`` with ``swiglu_alpha`` / ``swiglu_limit``).
    ``fuse_activation`` (silu only): the first GEMM keeps a gate and an up accumulator and
    writes silu(gate) * up, with the same roundings as the separate kernel, so neither the
    [pairs, 2I] gate_up tensor nor the activation launch exist. Off by default until a GPU
    sweep (benchmarks/moe_sweep.py --fuse-activation) shows where it wins."""
    if activation not in ("silu", "swigluoai"):
        raise ValueError(f"activation={activation!r} is not supported: expected 'silu' or 'swigluoai'")
    if fuse_activation and activation != "silu":
        raise ValueError(f"fuse_activation=True supports activation 'silu' only, not {activation!r}")
    num_tokens, hidden_size = hidden.shape
    num_experts, two_i, _ = w13.shape
    top_k = topk_ids.shape[1]
    if w2.shape != (num_experts, hidden_size, two_i // 2) or w13.shape[2] != hidden_size:
        raise ValueError(f"expert weights {tuple(w13.shape)} / {tuple(w2.shape)} do not fit hidden {hidden_size}")
    if num_tokens == 0:
        return hidden.new_zeros(0, hidden_size)
    num_pairs = num_tokens * top_k
    cfg = gemm_config(num_pairs, hidden.device, block_m, config, num_experts=num_experts,
                      elem_bytes=hidden.element_size())
    sorted_pairs, block_expert = align_pairs(topk_ids, num_experts, cfg["BLOCK_M"])
    hidden = hidden if hidden.stride(-1) == 1 else hidden.contiguous()
    weights = topk_weights.reshape(-1).float().contiguous()
    if fuse_activation:
        act = torch.empty((num_pairs, two_i // 2), dtype=hidden.dtype, device=hidden.device)
        _launch(hidden, w13, act, weights, sorted_pairs, block_expert, num_pairs, top_k, False, w13_bias, cfg,
                silu_gate_up=True)
    else:
        gate_up = torch.empty((num_pairs, two_i), dtype=hidden.dtype, device=hidden.device)
        _launch(hidden, w13, gate_up, weights, sorted_pairs, block_expert, num_pairs, top_k, False, w13_bias, cfg)
        if activation == "silu":
            act = silu_mul_triton(gate_up)  # one pass, where torch's silu and product take three
        else:
            act = swigluoai_triton(gate_up, swiglu_alpha, swiglu_limit)
    alloc = torch.zeros if skip_invalid_ids else torch.empty
    down = alloc((num_pairs, hidden_size), dtype=hidden.dtype, device=hidden.device)
    _launch(act, w2, down, weights, sorted_pairs, block_expert, num_pairs, 1, True, w2_bias, cfg)
    return down.view(num_tokens, top_k, hidden_size).sum(dim=1, dtype=torch.float32).to(hidden.dtype)
