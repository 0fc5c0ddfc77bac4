"""Triton kernels of the Mamba2 mixer over a ragged batch (references: mamba.py).

Both kernels take the step's request list from device tensors only (state rows,
has-initial-state flags, query_start_loc), so they are CUDA-graph safe: the grid depends
on the padded request count, never on token counts the host would have to read.

- ``causal_conv1d_varlen_triton``: depthwise causal conv with per-row conv state; one
  program per (request, channel block) walks the request's tokens in tiles, reading the window
  from the input or, before the chunk's first token, from the saved state; then writes
  the last K - 1 inputs back as the new state.
- ``ssm_scan_varlen_triton``: the selective-scan recurrence; one program per (request,
  block of the flattened head x head-dim axis) keeps its [BLOCK_R, N] state slice in
  registers and walks the request's tokens. For a decode row this is exactly the
  single-step update; for a prefill chunk it is a sequential scan (correct and graph
  safe, but latency bound on long prefills: steps with prefill tokens use the
  chunk-parallel ``mamba_ssd_triton.ssd_chunk_scan_varlen_triton``, which hands its
  single-token rows back to this kernel with ``single_token_rows_only``).

No integer argument of these kernels varies from call to call (sizes, strides and the
model's dt limits are fixed per layer; the request and token counts only size the grid),
so neither kernel needs ``do_not_specialize``: a step never triggers a recompile.

Padded requests (empty query) and dummy runs (``write_state=False``) write no state.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _as_u8(flags: torch.Tensor) -> torch.Tensor:
    """Bool flags as bytes (same storage, so still graph safe)."""
    return flags.view(torch.uint8) if flags.dtype == torch.bool else flags


@triton.jit
def _conv_varlen_kernel(
    x_ptr, w_ptr, b_ptr, state_ptr, rows_ptr, init_ptr, qsl_ptr, out_ptr,
    C, stride_xt, stride_sr, stride_sk, stride_ot,
    K: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, WRITE_STATE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
):
    i = tl.program_id(0)
    cb = tl.program_id(1)
    start = tl.load(qsl_ptr + i).to(tl.int64)
    end = tl.load(qsl_ptr + i + 1).to(tl.int64)
    row = tl.load(rows_ptr + i).to(tl.int64)
    init = tl.load(init_ptr + i).to(tl.int32)
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    zero_c = cols * 0  # scalar conditions are broadcast to vectors before masking
    init_c = (zero_c + init) != 0
    sbase = state_ptr + row * stride_sr
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_C], dtype=tl.float32)
    tt = tl.arange(0, BLOCK_T)
    # a tile of BLOCK_T tokens x BLOCK_C channels at a time
    for t0 in range(start, end, BLOCK_T):
        t = t0 + tt
        tmask = t < end
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32) + bias[None, :]
        for k in tl.static_range(K):
            j = t - (K - 1) + k  # token feeding tap k
            in_x = j >= start
            jx = tl.maximum(j, 0)
            m_x = tmask[:, None] & in_x[:, None] & cmask[None, :]
            xv = tl.load(x_ptr + jx[:, None] * stride_xt + cols[None, :], mask=m_x, other=0.0)
            sk = tl.maximum(K - 1 + j - start, 0)
            m_s = tmask[:, None] & (j < start)[:, None] & (cmask & init_c)[None, :]
            sv = tl.load(sbase + sk[:, None] * stride_sk + cols[None, :], mask=m_s, other=0.0)
            w = tl.load(w_ptr + cols * K + k, mask=cmask, other=0.0).to(tl.float32)
            acc += w[None, :] * (xv.to(tl.float32) + sv.to(tl.float32))
        if SILU:
            acc = acc * tl.sigmoid(acc)
        tl.store(out_ptr + t[:, None] * stride_ot + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=tmask[:, None] & cmask[None, :])
    if WRITE_STATE:
        # new state slot k <- input end - (K - 1) + k (from x, or from the old state when the
        # chunk is shorter than K - 1). Everything is read into registers first; the barrier
        # keeps any thread of this program from overwriting a slot another still reads.
        kk = tl.arange(0, BLOCK_K)
        j = end - (K - 1) + kk
        in_x = j >= start
        km = kk < K - 1
        jx = tl.maximum(j, 0)
        xv = tl.load(x_ptr + jx[:, None] * stride_xt + cols[None, :], mask=(km & in_x)[:, None] & cmask[None, :],
                     other=0.0)
        sk = tl.maximum(K - 1 + j - start, 0)
        sv = tl.load(sbase + sk[:, None] * stride_sk + cols[None, :],
                     mask=(km & (j < start))[:, None] & (cmask & init_c)[None, :], other=0.0)
        new = (xv.to(tl.float32) + sv.to(tl.float32)).to(state_ptr.dtype.element_ty)
        tl.debug_barrier()
        tl.store(sbase + kk[:, None] * stride_sk + cols[None, :], new,
                 mask=km[:, None] & (cmask & ((zero_c + end) > start))[None, :])


def causal_conv1d_varlen_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_state: torch.Tensor,
    state_rows: torch.Tensor, has_init: torch.Tensor, query_start_loc: torch.Tensor,
    activation: str | None = "silu", write_state: bool = True, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, C] (inner stride 1), weight [C, K], conv_state [rows, K - 1, C]; one request
    per entry of ``state_rows`` (device int), tokens per ``query_start_loc`` (device).
    Returns out [T, C] in x's dtype (padding tokens are zero)."""
    T, C = x.shape
    K = weight.shape[1]
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"conv activation {activation!r} is not supported: expected 'silu' or None")
    assert x.stride(1) == 1 and conv_state.stride(2) == 1 and weight.is_contiguous()
    if out is None:
        out = torch.zeros(T, C, dtype=x.dtype, device=x.device)
    R = state_rows.shape[0]
    if R == 0:
        return out
    if _INTERPRET:  # few, large programs: the interpreter's cost is per operation
        BLOCK_T, BLOCK_C = 32, triton.next_power_of_2(C)
    else:
        BLOCK_T, BLOCK_C = 8, min(128, triton.next_power_of_2(C))
    grid = (R, triton.cdiv(C, BLOCK_C))
    _conv_varlen_kernel[grid](
        x, weight, bias if bias is not None else weight, conv_state, state_rows, _as_u8(has_init), query_start_loc, out,
        C, x.stride(0), conv_state.stride(0), conv_state.stride(1), out.stride(0),
        K=K, HAS_BIAS=bias is not None, SILU=activation is not None, WRITE_STATE=write_state,
        BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C, BLOCK_K=triton.next_power_of_2(max(K - 1, 1)),
    )
    return out


@triton.jit
def _ssm_varlen_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, state_ptr, rows_ptr, init_ptr, qsl_ptr, out_ptr, steps_ptr,
    HP, P, N, heads_per_group, dt_min, dt_max,
    stride_xt, stride_dtt, stride_bt, stride_ct, stride_sr, stride_ot, stride_pr, stride_pj, num_steps,
    HAS_LIMIT: tl.constexpr, WRITE_STATE: tl.constexpr, SINGLE_ONLY: tl.constexpr, SAVE_STEPS: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # one program: BLOCK_R rows of the flattened (head, head_dim) axis x all N state columns
    i = tl.program_id(0)
    rb = tl.program_id(1)
    start = tl.load(qsl_ptr + i).to(tl.int64)
    end = tl.load(qsl_ptr + i + 1).to(tl.int64)
    if SINGLE_ONLY:
        if end - start != 1:  # multi-token requests are the chunked scan's (mamba_ssd_triton.py)
            return
    row = tl.load(rows_ptr + i).to(tl.int64)
    init = tl.load(init_ptr + i).to(tl.int32)
    r = rb * BLOCK_R + tl.arange(0, BLOCK_R)  # flattened h * P + p
    n = tl.arange(0, BLOCK_N)
    rm = r < HP
    nm = n < N
    h = r // P
    g = h // heads_per_group
    smask = rm[:, None] & nm[None, :]
    zero = r[:, None] * 0 + n[None, :] * 0  # scalar conditions are broadcast before masking
    # state [rows, H, P, N] contiguous in (H, P, N): flattened row r starts at r * N
    s_ptrs = state_ptr + row * stride_sr + r[:, None] * N + n[None, :]
    S = tl.load(s_ptrs, mask=smask & ((zero + init) != 0), other=0.0).to(tl.float32)
    A = tl.load(A_ptr + h, mask=rm, other=0.0).to(tl.float32)
    Dh = tl.load(D_ptr + h, mask=rm, other=0.0).to(tl.float32)
    dtb = tl.load(dtb_ptr + h, mask=rm, other=0.0).to(tl.float32)
    bc_off = g[:, None] * N + n[None, :]
    for t in range(start, end):
        dt = tl.load(dt_ptr + t * stride_dtt + h, mask=rm, other=0.0).to(tl.float32) + dtb
        dt = tl.where(dt > 20.0, dt, tl.log(1.0 + tl.exp(dt)))  # softplus, threshold 20 as torch
        if HAS_LIMIT:
            dt = tl.minimum(tl.maximum(dt, dt_min), dt_max)
        dA = tl.exp(dt * A)
        x = tl.load(x_ptr + t * stride_xt + r, mask=rm, other=0.0).to(tl.float32)
        Bv = tl.load(B_ptr + t * stride_bt + bc_off, mask=smask, other=0.0).to(tl.float32)
        Cv = tl.load(C_ptr + t * stride_ct + bc_off, mask=smask, other=0.0).to(tl.float32)
        S = S * dA[:, None] + (dt * x)[:, None] * Bv
        y = tl.sum(S * Cv, axis=1) + Dh * x
        tl.store(out_ptr + t * stride_ot + r, y.to(out_ptr.dtype.element_ty), mask=rm)
        if SAVE_STEPS:  # the state after each of the first num_steps positions (speculative verification)
            j = t - start
            tl.store(steps_ptr + row * stride_pr + j * stride_pj + r[:, None] * N + n[None, :], S,
                     mask=smask & ((zero + j) < num_steps))
    if WRITE_STATE:
        tl.debug_barrier()  # every thread has read the old state before any overwrites it
        tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=smask & ((zero + end) > start))


def ssm_scan_varlen_triton(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
    dt_bias: torch.Tensor, ssm_state: torch.Tensor, state_rows: torch.Tensor, has_init: torch.Tensor,
    query_start_loc: torch.Tensor, *, num_heads: int, head_dim: int, n_groups: int, d_state: int,
    dt_limit: tuple[float, float] = (0.0, float("inf")), write_state: bool = True,
    out: torch.Tensor | None = None, single_token_rows_only: bool = False,
    save_steps: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, H*P], dt [T, H], B/C [T, G*N] (row strides free, inner stride 1), A/D/dt_bias
    [H], ssm_state [rows, H, P, N]. Returns y [T, H, P] float32 (padding tokens zero).
    ``single_token_rows_only``: leave requests of more than one token alone (their
    outputs and state), for the chunked scan to take them. ``save_steps`` [rows, k, H,
    P, N] float32: also store the state after each of a request's first k tokens at
    ``save_steps[row, j]`` (speculative verification keeps them to roll back to)."""
    T = x.shape[0]
    for t in (x, dt, B, C):
        assert t.stride(-1) == 1
    assert ssm_state[0].is_contiguous(), "ssm_state rows must be contiguous [H, P, N]"
    if out is None:
        out = torch.zeros(T, num_heads, head_dim, dtype=torch.float32, device=x.device)
    R = state_rows.shape[0]
    if R == 0:
        return out
    BLOCK_N = triton.next_power_of_2(d_state)
    HP = num_heads * head_dim
    if _INTERPRET:  # few, large programs: the interpreter's cost is per operation
        BLOCK_R = triton.next_power_of_2(HP)
    else:
        BLOCK_R = min(triton.next_power_of_2(HP), max(1, 4096 // BLOCK_N), 64)
    lo, hi = dt_limit
    has_limit = lo > 0.0 or hi != float("inf")
    if save_steps is not None:
        assert save_steps.dtype == torch.float32 and save_steps[0, 0].is_contiguous()
        steps, steps_strides = save_steps, (save_steps.stride(0), save_steps.stride(1), save_steps.shape[1])
    else:
        steps, steps_strides = out, (0, 0, 0)
    grid = (R, triton.cdiv(HP, BLOCK_R))
    _ssm_varlen_kernel[grid](
        x, dt, A, B, C, D, dt_bias, ssm_state, state_rows, _as_u8(has_init), query_start_loc, out, steps,
        HP, head_dim, d_state, num_heads // n_groups, float(lo), float(hi) if has_limit else 0.0,
        x.stride(0), dt.stride(0), B.stride(0), C.stride(0), ssm_state.stride(0), out.stride(0), *steps_strides,
        HAS_LIMIT=has_limit, WRITE_STATE=write_state, SINGLE_ONLY=single_token_rows_only,
        SAVE_STEPS=save_steps is not None, BLOCK_R=BLOCK_R, BLOCK_N=BLOCK_N,
    )
    return out
