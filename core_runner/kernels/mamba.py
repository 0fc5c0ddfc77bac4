"""Mamba2 mixer math in plain torch: the ground truth for the Triton kernels.

Layouts (one request's chunk of L tokens, or a batch of R decode rows):
- conv input / output ``[L, conv_dim]``; conv state ``[K - 1, conv_dim]`` holds the last
  K - 1 inputs of the request (oldest first); depthwise weight ``[conv_dim, K]``.
- SSM input x ``[L, H, P]``, raw dt ``[L, H]`` (before bias and softplus), B and C
  ``[L, G, N]`` (head h reads group h // (H // G)), SSM state ``[H, P, N]`` (float32).

The recurrence, per head: dt' = clamp(softplus(dt + dt_bias)), S <- exp(dt' A) S +
dt' x B^T, y = S C + D x. The chunked form computes the same thing a chunk at a time:
inside a chunk with a = dt' A and cumulative sums c, token t sees token s <= t with
weight exp(c_t - c_s) (C_t . B_s) dt'_s, plus the carried state decayed by exp(c_t).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def process_dt(dt: torch.Tensor, dt_bias: torch.Tensor, dt_limit: tuple[float, float]) -> torch.Tensor:
    dt = F.softplus(dt.float() + dt_bias.float())
    lo, hi = dt_limit
    if lo > 0.0 or hi != float("inf"):
        dt = dt.clamp(min=lo, max=hi)
    return dt


def _act(x: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return x
    if activation in ("silu", "swish"):
        return F.silu(x)
    raise ValueError(f"conv activation {activation!r} is not supported: expected 'silu' or None")


# ---------------------------------------------------------------------------------
# causal depthwise conv
# ---------------------------------------------------------------------------------
def causal_conv1d_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: torch.Tensor | None,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [L, C], weight [C, K], state [K - 1, C] or None (zeros) -> (out [L, C], new state)."""
    L, C = x.shape
    K = weight.shape[1]
    if state is None:
        state = x.new_zeros(K - 1, C)
    full = torch.cat([state.to(x.dtype), x], dim=0).float()  # [K - 1 + L, C]
    out = torch.zeros(L, C, dtype=torch.float32, device=x.device)
    w = weight.float()
    for k in range(K):
        out += full[k: k + L] * w[:, k]
    if bias is not None:
        out += bias.float()
    return _act(out, activation).to(x.dtype), full[L:].to(x.dtype) if K > 1 else full[:0].to(x.dtype)


def conv_step_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: torch.Tensor,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row: x [R, C], state [R, K - 1, C] -> (out [R, C], new state [R, K - 1, C])."""
    full = torch.cat([state.to(x.dtype), x[:, None]], dim=1).float()  # [R, K, C]
    out = (full * weight.float().t()[None]).sum(dim=1)
    if bias is not None:
        out += bias.float()
    return _act(out, activation).to(x.dtype), full[:, 1:].to(state.dtype)


# ---------------------------------------------------------------------------------
# selective scan
# ---------------------------------------------------------------------------------
def _expand_groups(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[..., G, N] -> [..., H, N]: head h reads group h // (H // G)."""
    return t.repeat_interleave(num_heads // t.shape[-2], dim=-2)


def ssm_step_ref(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: torch.Tensor, dt_bias: torch.Tensor, dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Single-token update for R rows: state [R, H, P, N], x [R, H, P], dt [R, H],
    B/C [R, G, N] -> (y [R, H, P] float32, new state [R, H, P, N] float32)."""
    H = x.shape[1]
    dt = process_dt(dt, dt_bias, dt_limit)  # [R, H]
    dA = torch.exp(dt * A.float())  # [R, H]
    Bh, Ch = _expand_groups(B.float(), H), _expand_groups(C.float(), H)  # [R, H, N]
    xf = x.float()
    new = state.float() * dA[:, :, None, None] + (dt[:, :, None] * xf)[..., None] * Bh[:, :, None, :]
    y = torch.einsum("rhpn,rhn->rhp", new, Ch) + D.float()[None, :, None] * xf
    return y, new


def ssd_chunk_scan_ref(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
    dt_bias: torch.Tensor, init_state: torch.Tensor | None, chunk_size: int,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked scan of one request: x [L, H, P], dt [L, H], B/C [L, G, N], init_state
    [H, P, N] or None -> (y [L, H, P] float32, final state [H, P, N] float32)."""
    L, H, P = x.shape
    N = B.shape[-1]
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    dt = process_dt(dt, dt_bias, dt_limit)  # [L, H]
    a = dt * A.float()  # [L, H], <= 0
    xf = x.float()
    Bh, Ch = _expand_groups(B.float(), H), _expand_groups(C.float(), H)  # [L, H, N]
    state = x.new_zeros(H, P, N, dtype=torch.float32) if init_state is None else init_state.float().clone()
    y = torch.empty(L, H, P, dtype=torch.float32, device=x.device)
    for s in range(0, L, chunk_size):
        e = min(L, s + chunk_size)
        l = e - s
        cum = torch.cumsum(a[s:e], dim=0)  # [l, H]
        # decay from token j to token i (i >= j): exp(cum_i - cum_j); masked above the diagonal
        seg = cum[:, None, :] - cum[None, :, :]  # [i, j, H]
        causal = torch.ones(l, l, dtype=torch.bool, device=x.device).tril()
        decay = torch.exp(seg.masked_fill(~causal[:, :, None], float("-inf")))
        scores = torch.einsum("ihn,jhn->ijh", Ch[s:e], Bh[s:e]) * decay * dt[s:e][None, :, :]
        y_in = torch.einsum("ijh,jhp->ihp", scores, xf[s:e])
        y_carry = torch.einsum("ihn,hpn->ihp", Ch[s:e], state) * torch.exp(cum)[:, :, None]
        y[s:e] = y_in + y_carry + D.float()[None, :, None] * xf[s:e]
        # state at the chunk end
        to_end = torch.exp(cum[-1][None, :] - cum) * dt[s:e]  # [l, H]
        state = state * torch.exp(cum[-1])[:, None, None] + torch.einsum(
            "jh,jhp,jhn->hpn", to_end, xf[s:e], Bh[s:e]
        )
    return y, state


# ---------------------------------------------------------------------------------
# the ragged batch: conv + scan for every request of a step
# ---------------------------------------------------------------------------------
def mamba_varlen_ref(
    xbc: torch.Tensor, dt: torch.Tensor, conv_weight: torch.Tensor, conv_bias: torch.Tensor | None,
    A: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor,
    conv_state: torch.Tensor, ssm_state: torch.Tensor,
    rows: list[int], has_init: list[bool], query_start_loc: list[int],
    *, d_inner: int, num_heads: int, head_dim: int, n_groups: int, d_state: int, chunk_size: int,
    activation: str | None = "silu", dt_limit: tuple[float, float] = (0.0, float("inf")),
    write_state: bool = True,
) -> torch.Tensor:
    """Conv + SSM for a step's requests (concatenated per ``query_start_loc``, host lists).

    xbc [T, conv_dim] (x | B | C before the conv), dt [T, H]; conv_state [rows, K - 1,
    conv_dim] and ssm_state [rows, H, P, N] are read at ``rows[i]`` when ``has_init[i]``
    (else zeros) and written back there when ``write_state``. Decode rows (one token
    with saved state) use the single-step update, batched; other requests the chunked
    scan. Tokens past the last request are padding: their output is zero.
    Returns y [T, H, P] float32.
    """
    T = xbc.shape[0]
    gn = n_groups * d_state
    y = torch.zeros(T, num_heads, head_dim, dtype=torch.float32, device=xbc.device)
    n = len(rows)
    step = [i for i in range(n) if query_start_loc[i + 1] - query_start_loc[i] == 1 and has_init[i]]
    if step:
        tok = torch.tensor([query_start_loc[i] for i in step], dtype=torch.long, device=xbc.device)
        r = torch.tensor([rows[i] for i in step], dtype=torch.long, device=xbc.device)
        conv_out, new_conv = conv_step_ref(xbc[tok], conv_weight, conv_bias, conv_state[r], activation)
        xs, Bs, Cs = conv_out.split([d_inner, gn, gn], dim=-1)
        ys, new_ssm = ssm_step_ref(
            ssm_state[r], xs.reshape(-1, num_heads, head_dim), dt[tok], A, Bs.reshape(-1, n_groups, d_state),
            Cs.reshape(-1, n_groups, d_state), D, dt_bias, dt_limit,
        )
        y[tok] = ys
        if write_state:
            conv_state[r] = new_conv.to(conv_state.dtype)
            ssm_state[r] = new_ssm.to(ssm_state.dtype)
    done = set(step)
    for i in range(n):
        s, e = query_start_loc[i], query_start_loc[i + 1]
        if i in done or e == s:
            continue
        row = rows[i]
        cs = conv_state[row] if has_init[i] else None
        ss = ssm_state[row] if has_init[i] else None
        conv_out, new_conv = causal_conv1d_ref(xbc[s:e], conv_weight, conv_bias, cs, activation)
        xs, Bs, Cs = conv_out.split([d_inner, gn, gn], dim=-1)
        ys, new_ssm = ssd_chunk_scan_ref(
            xs.reshape(-1, num_heads, head_dim), dt[s:e], A, Bs.reshape(-1, n_groups, d_state),
            Cs.reshape(-1, n_groups, d_state), D, dt_bias, ss, chunk_size, dt_limit,
        )
        y[s:e] = ys
        if write_state:
            conv_state[row] = new_conv.to(conv_state.dtype)
            ssm_state[row] = new_ssm.to(ssm_state.dtype)
    return y
