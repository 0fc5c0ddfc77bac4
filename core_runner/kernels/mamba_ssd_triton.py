"""Chunk-parallel (SSD) selective scan of the Mamba2 mixer over a ragged batch, in Triton.

Same inputs, outputs and state handling as ``ssm_scan_varlen_triton`` (mamba_triton.py);
the math is ``ssd_chunk_scan_ref`` (mamba.py). Each request's tokens are cut into
chunks of CHUNK tokens (never crossing a request boundary). With a = dt' A and c the
cumulative sum of a inside a chunk:

1. ``_chunk_table_kernel``: from ``query_start_loc`` alone (device), the global chunk
   list: the request and first token of every chunk, and each request's first chunk.
2. ``_chunk_state_kernel`` per (chunk, head, head-dim block): the state the chunk would
   leave behind starting from zeros, sum_s exp(c_end - c_s) dt'_s x_s B_s^T (one tl.dot
   per d_state block), and the chunk's total decay c_end.
3. ``_state_pass_kernel`` per (request, head, block of the flattened head-dim x d_state
   state): walks the request's chunks in order from the row's saved state (or zeros),
   replaces each chunk's slot by the state entering it, S_c = exp(c_end) S_{c-1} + chunk
   state, and writes the final state to the row.
4. ``_chunk_out_kernel`` per (chunk, head, head-dim block): y = (C B^T o exp(c_t - c_s)
   dt'_s, causal) x + exp(c_t) C S_in + D x.

Single-token rows (decode) take the sequential kernel's one-step update instead (it
reads and writes the state once, where the chunk path would move it through scratch);
the chunk kernels skip them. Grids and scratch are sized from host ints only (token
count, padded request count), so the call can be captured in a CUDA graph: the chunk
count is bounded by min(T, cdiv(T, CHUNK) + min(R, T // 2)) and surplus programs exit.
Scratch: that many chunks x [H, P, N] float32 states (the dominant cost) + [H] decays.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_runner.kernels.mamba_triton import _INTERPRET, _as_u8, ssm_scan_varlen_triton


@triton.jit(do_not_specialize=["R", "max_chunks"])
def _chunk_table_kernel(
    qsl_ptr, creq_ptr, cstart_ptr, chunk0_ptr, R, max_chunks,
    CHUNK: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr,
):
    pid = tl.program_id(0)
    ri = tl.arange(0, BLOCK_R)
    rm = ri < R
    s = tl.load(qsl_ptr + ri, mask=rm, other=0)
    e = tl.load(qsl_ptr + ri + 1, mask=rm, other=0)
    n = e - s
    nc = tl.where(rm & (n >= 2), (n + CHUNK - 1) // CHUNK, 0)  # single-token rows: no chunk
    cend = tl.cumsum(nc, axis=0)
    cbeg = cend - nc
    if pid == 0:
        tl.store(chunk0_ptr + ri, cbeg, mask=rm)
    total = tl.sum(nc, axis=0)
    g = pid * BLOCK_G + tl.arange(0, BLOCK_G)
    # request of chunk g: how many requests end at or before it
    req = tl.sum((cend[None, :] <= g[:, None]).to(tl.int32), axis=1)
    onehot = ri[None, :] == req[:, None]
    s_req = tl.sum(tl.where(onehot, s[None, :], 0), axis=1)
    b_req = tl.sum(tl.where(onehot, cbeg[None, :], 0), axis=1)
    gm = g < max_chunks
    tl.store(creq_ptr + g, tl.where(g < total, req, -1), mask=gm)
    tl.store(cstart_ptr + g, s_req + (g - b_req) * CHUNK, mask=gm)


@triton.jit
def _chunk_tokens_dt(
    c, i, h, dt_ptr, A_ptr, dtb_ptr, cstart_ptr, qsl_ptr, dt_min, dt_max, stride_dtt,
    HAS_LIMIT: tl.constexpr, CHUNK: tl.constexpr,
):
    """Chunk c of request i: lanes ti, tokens t and their mask tm (tokens of the chunk,
    cut at the request's end), dt' (bias, softplus as torch with threshold 20, clamp; 0
    past the chunk) and the cumulative sum of dt' A over the chunk."""
    start = tl.load(cstart_ptr + c).to(tl.int64)
    end = tl.minimum(start + CHUNK, tl.load(qsl_ptr + i + 1).to(tl.int64))
    ti = tl.arange(0, CHUNK)
    t = start + ti
    tm = t < end
    A = tl.load(A_ptr + h).to(tl.float32)
    dtb = tl.load(dtb_ptr + h).to(tl.float32)
    dt = tl.load(dt_ptr + t * stride_dtt + h, mask=tm, other=0.0).to(tl.float32) + dtb
    dt = tl.where(dt > 20.0, dt, tl.log(1.0 + tl.exp(dt)))
    if HAS_LIMIT:
        dt = tl.minimum(tl.maximum(dt, dt_min), dt_max)
    dt = tl.where(tm, dt, 0.0)
    return ti, t, tm, dt, tl.cumsum(dt * A, axis=0)


@triton.jit
def _chunk_state_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, dtb_ptr, creq_ptr, cstart_ptr, qsl_ptr, states_ptr, decay_ptr,
    H, P, N, heads_per_group, dt_min, dt_max, stride_xt, stride_dtt, stride_bt,
    HAS_LIMIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    c = tl.program_id(0)
    h = tl.program_id(1)
    pb = tl.program_id(2)
    i = tl.load(creq_ptr + c)
    if i < 0:  # past the step's last chunk
        return
    ti, t, tm, dt, cum = _chunk_tokens_dt(c, i, h, dt_ptr, A_ptr, dtb_ptr, cstart_ptr, qsl_ptr, dt_min, dt_max,
                                          stride_dtt, HAS_LIMIT, CHUNK)
    total = tl.sum(tl.where(ti == CHUNK - 1, cum, 0.0), axis=0)  # padded lanes add 0: the chunk's sum
    w = tl.exp(total - cum) * dt  # weight of token s in the chunk-end state
    p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    pm = p < P
    xv = tl.load(x_ptr + t[:, None] * stride_xt + h * P + p[None, :], mask=tm[:, None] & pm[None, :], other=0.0)
    xw = tl.trans((xv.to(tl.float32) * w[:, None]).to(B_ptr.dtype.element_ty))  # [BLOCK_P, CHUNK]
    g = h // heads_per_group
    sbase = states_ptr + (c.to(tl.int64) * H + h) * P * N
    for n0 in range(0, N, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nm = n < N
        bv = tl.load(B_ptr + t[:, None] * stride_bt + g * N + n[None, :], mask=tm[:, None] & nm[None, :], other=0.0)
        s = tl.dot(xw, bv, input_precision=DOT_PRECISION)  # [BLOCK_P, BLOCK_N]
        tl.store(sbase + p[:, None] * N + n[None, :], s, mask=pm[:, None] & nm[None, :])
    if pb == 0:
        tl.store(decay_ptr + c * H + h, total)


@triton.jit
def _state_pass_kernel(
    states_ptr, decay_ptr, state_ptr, rows_ptr, init_ptr, qsl_ptr, chunk0_ptr,
    H, PN, stride_sr,
    WRITE_STATE: tl.constexpr, CHUNK: tl.constexpr, BLOCK_S: tl.constexpr,
):
    i = tl.program_id(0)
    h = tl.program_id(1)
    sb = tl.program_id(2)
    start = tl.load(qsl_ptr + i)
    end = tl.load(qsl_ptr + i + 1)
    if end - start < 2:  # padded request (nothing to do) or single-token row (sequential kernel)
        return
    row = tl.load(rows_ptr + i).to(tl.int64)
    init = tl.load(init_ptr + i).to(tl.int32)
    e = sb * BLOCK_S + tl.arange(0, BLOCK_S)
    em = e < PN
    # state [rows, H, P, N] contiguous in (H, P, N): head h's slice is PN values from h * PN
    s_ptrs = state_ptr + row * stride_sr + h * PN + e
    S = tl.load(s_ptrs, mask=em & ((e * 0 + init) != 0), other=0.0).to(tl.float32)
    c0 = tl.load(chunk0_ptr + i).to(tl.int64)
    nc = (end - start + CHUNK - 1) // CHUNK
    for k in range(0, nc):
        c = c0 + k
        ptrs = states_ptr + (c * H + h) * PN + e
        cs = tl.load(ptrs, mask=em, other=0.0)
        dec = tl.exp(tl.load(decay_ptr + c * H + h))
        tl.debug_barrier()  # the chunk's own state is read by every thread before it is replaced
        tl.store(ptrs, S, mask=em)  # the state entering chunk c
        S = S * dec + cs
    if WRITE_STATE:
        tl.debug_barrier()  # every thread has read the old row state before any overwrites it
        tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=em)


@triton.jit
def _chunk_out_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, creq_ptr, cstart_ptr, qsl_ptr, states_ptr, out_ptr,
    H, P, N, heads_per_group, dt_min, dt_max, stride_xt, stride_dtt, stride_bt, stride_ct, stride_ot,
    HAS_LIMIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    c = tl.program_id(0)
    h = tl.program_id(1)
    pb = tl.program_id(2)
    i = tl.load(creq_ptr + c)
    if i < 0:
        return
    ti, t, tm, dt, cum = _chunk_tokens_dt(c, i, h, dt_ptr, A_ptr, dtb_ptr, cstart_ptr, qsl_ptr, dt_min, dt_max,
                                          stride_dtt, HAS_LIMIT, CHUNK)
    p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    pm = p < P
    g = h // heads_per_group
    sbase = states_ptr + (c.to(tl.int64) * H + h) * P * N
    cb = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)  # C_t . B_s
    y_carry = tl.zeros([CHUNK, BLOCK_P], dtype=tl.float32)  # C_t . S_in[p]
    for n0 in range(0, N, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nm = n < N
        m_tn = tm[:, None] & nm[None, :]
        cv = tl.load(C_ptr + t[:, None] * stride_ct + g * N + n[None, :], mask=m_tn, other=0.0)
        bv = tl.load(B_ptr + t[:, None] * stride_bt + g * N + n[None, :], mask=m_tn, other=0.0)
        cb += tl.dot(cv, tl.trans(bv.to(cv.dtype)), input_precision=DOT_PRECISION)
        s_in = tl.load(sbase + p[None, :] * N + n[:, None], mask=nm[:, None] & pm[None, :], other=0.0)
        y_carry += tl.dot(cv, s_in.to(cv.dtype), input_precision=DOT_PRECISION)  # [CHUNK, BLOCK_P]
    causal = ti[:, None] >= ti[None, :]
    seg = tl.where(causal, cum[:, None] - cum[None, :], float("-inf"))
    scores = cb * tl.exp(seg) * dt[None, :]
    xv = tl.load(x_ptr + t[:, None] * stride_xt + h * P + p[None, :], mask=tm[:, None] & pm[None, :], other=0.0)
    y = tl.dot(scores.to(xv.dtype), xv, input_precision=DOT_PRECISION)
    Dh = tl.load(D_ptr + h).to(tl.float32)
    y += y_carry * tl.exp(cum)[:, None] + Dh * xv.to(tl.float32)
    tl.store(out_ptr + t[:, None] * stride_ot + h * P + p[None, :], y.to(out_ptr.dtype.element_ty),
             mask=tm[:, None] & pm[None, :])


def max_num_chunks(num_tokens: int, num_reqs: int, chunk: int) -> int:
    """Host bound on the chunks of the multi-token requests of a step: each such request
    has >= 2 tokens and adds at most one partial chunk, and a chunk holds >= 1 token."""
    return min(num_tokens, triton.cdiv(num_tokens, chunk) + min(num_reqs, num_tokens // 2))


def ssd_chunk_scan_varlen_triton(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
    dt_bias: torch.Tensor, ssm_state: torch.Tensor, state_rows: torch.Tensor, has_init: torch.Tensor,
    query_start_loc: torch.Tensor, *, num_heads: int, head_dim: int, n_groups: int, d_state: int,
    dt_limit: tuple[float, float] = (0.0, float("inf")), write_state: bool = True,
    out: torch.Tensor | None = None, chunk_size: int = 64,
    block_p: int | None = None, block_n: int | None = None,
) -> torch.Tensor:
    """Drop-in for ``ssm_scan_varlen_triton`` (same arguments and result) computing
    multi-token requests chunk-parallel. x [T, H*P], dt [T, H], B/C [T, G*N] (row
    strides free, inner stride 1), A/D/dt_bias [H], ssm_state [rows, H, P, N]. Returns
    y [T, H, P] float32 (padding tokens zero). ``chunk_size`` is rounded to a power of
    two (16..64 on a GPU); ``block_p`` / ``block_n`` override the head-dim / d_state
    tiles (powers of two; tests use them to exercise the tiling)."""
    T = x.shape[0]
    for t in (x, dt, B, C):
        assert t.stride(-1) == 1
    assert x.dtype == B.dtype == C.dtype, "x, B and C must share a dtype (the conv output)"
    assert ssm_state[0].is_contiguous(), "ssm_state rows must be contiguous [H, P, N]"
    if out is None:
        out = torch.zeros(T, num_heads, head_dim, dtype=torch.float32, device=x.device)
    R = state_rows.shape[0]
    if R == 0:
        return out
    # single-token rows: the one-step update of the sequential kernel
    ssm_scan_varlen_triton(
        x, dt, A, B, C, D, dt_bias, ssm_state, state_rows, has_init, query_start_loc, num_heads=num_heads,
        head_dim=head_dim, n_groups=n_groups, d_state=d_state, dt_limit=dt_limit, write_state=write_state,
        out=out, single_token_rows_only=True,
    )
    if T < 2:
        return out
    H, P, N = num_heads, head_dim, d_state
    chunk = triton.next_power_of_2(max(1, chunk_size))
    if not _INTERPRET:  # tl.dot needs K >= 16 for 16-bit inputs; 64 bounds the [CHUNK, CHUNK] tile
        chunk = min(max(chunk, 16), 64)
    lo_n = 1 if _INTERPRET else 16
    # tile overrides (tests) are raised to the tl.dot minimum on a GPU
    BLOCK_P = max(lo_n, block_p or min(64, triton.next_power_of_2(P)))
    BLOCK_N = max(lo_n, block_n or min(64, triton.next_power_of_2(N)))
    NC = max_num_chunks(T, R, chunk)
    dev = x.device
    creq = torch.empty(NC, dtype=torch.int32, device=dev)
    cstart = torch.empty(NC, dtype=torch.int32, device=dev)
    chunk0 = torch.empty(R, dtype=torch.int32, device=dev)
    decay = torch.empty(NC, H, dtype=torch.float32, device=dev)
    states = torch.empty(NC, H, P, N, dtype=torch.float32, device=dev)
    BLOCK_R = max(16, triton.next_power_of_2(R))
    BLOCK_G = max(1, min(64, 4096 // BLOCK_R))  # [BLOCK_G, BLOCK_R] request-search tiles
    _chunk_table_kernel[(triton.cdiv(NC, BLOCK_G),)](
        query_start_loc, creq, cstart, chunk0, R, NC, CHUNK=chunk, BLOCK_R=BLOCK_R, BLOCK_G=BLOCK_G,
    )
    lo, hi = dt_limit
    has_limit = lo > 0.0 or hi != float("inf")
    dt_args = (float(lo), float(hi) if has_limit else 0.0)
    dot_precision = "ieee" if x.dtype == torch.float32 else "tf32"  # no TF32 rounding of fp32
    hpg = H // n_groups
    grid = (NC, H, triton.cdiv(P, BLOCK_P))
    _chunk_state_kernel[grid](
        x, dt, A, B, dt_bias, creq, cstart, query_start_loc, states, decay,
        H, P, N, hpg, *dt_args, x.stride(0), dt.stride(0), B.stride(0),
        HAS_LIMIT=has_limit, CHUNK=chunk, BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N, DOT_PRECISION=dot_precision,
    )
    PN = P * N
    BLOCK_S = triton.next_power_of_2(PN) if _INTERPRET else min(1024, triton.next_power_of_2(PN))
    _state_pass_kernel[(R, H, triton.cdiv(PN, BLOCK_S))](
        states, decay, ssm_state, state_rows, _as_u8(has_init), query_start_loc, chunk0,
        H, PN, ssm_state.stride(0), WRITE_STATE=write_state, CHUNK=chunk, BLOCK_S=BLOCK_S,
    )
    _chunk_out_kernel[grid](
        x, dt, A, B, C, D, dt_bias, creq, cstart, query_start_loc, states, out,
        H, P, N, hpg, *dt_args, x.stride(0), dt.stride(0), B.stride(0), C.stride(0), out.stride(0),
        HAS_LIMIT=has_limit, CHUNK=chunk, BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N, DOT_PRECISION=dot_precision,
        num_warps=8,
    )
    return out
