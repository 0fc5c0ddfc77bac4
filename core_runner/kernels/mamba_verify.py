"""Speculative verification for the Mamba2 mixer: per-position states and the rollback.

A verification step feeds a decoding request its last token and k proposals (1 + k
positions). After sampling, only the first ``accepted + 1`` of them are kept, and the
recurrent state must be the one those alone leave. The step therefore keeps, per state
row, what rolling back needs (docs/hybrid_speculation.md):

- ``conv_window [rows, K - 1 + k + 1, conv_dim]``: the row's conv state before the step
  followed by the step's 1 + k conv inputs; the conv state after m kept positions is
  ``window[m : m + K - 1]`` (the last K - 1 inputs seen).
- ``ssm_steps [rows, k, H, P, N]`` float32: the SSM state after each of the first k
  positions; the state after all 1 + k is the row's own (the scan writes it as usual).

``commit_verified`` then picks, on the device, the state at each request's accepted count
(no host read). Everything here is plain torch indexing: the same code on CPU and GPU.
"""
from __future__ import annotations

import torch

from core_runner.kernels.mamba import conv_step_ref, ssm_step_ref


def stash_conv_window(conv_state: torch.Tensor, conv_window: torch.Tensor, xbc: torch.Tensor,
                      rows: torch.Tensor, starts: torch.Tensor) -> None:
    """Before the conv runs: ``conv_window[rows]`` <- the rows' conv states, then the 1 + k
    conv inputs from each request's first token ``starts`` (device [V]). Positions past a
    request's own 1 + k_i read later tokens (clamped to the step): never used, since a
    commit keeps at most 1 + k_i."""
    k1 = conv_state.shape[1]
    width = conv_window.shape[1] - k1
    rows = rows.long()
    conv_window[rows, :k1] = conv_state[rows]
    j = torch.arange(width, device=xbc.device)
    tok = (starts.long()[:, None] + j[None, :]).clamp_max(xbc.shape[0] - 1)
    conv_window[rows[:, None], (k1 + j)[None, :]] = xbc[tok].to(conv_window.dtype)


def commit_verified(conv_state: torch.Tensor, ssm_state: torch.Tensor, conv_window: torch.Tensor,
                    ssm_steps: torch.Tensor, rows: torch.Tensor, accepted: torch.Tensor,
                    counts: torch.Tensor) -> None:
    """After sampling: each request of ``rows`` kept ``accepted`` of its ``counts``
    proposals (device [V]), i.e. accepted + 1 positions. Its conv state becomes the window
    after those, its SSM state the one saved after position ``accepted`` (or the row's own
    when every proposal was kept)."""
    rows, acc = rows.long(), accepted.long()
    k1 = conv_state.shape[1]
    pos = acc[:, None] + 1 + torch.arange(k1, device=acc.device)[None, :]
    conv_state[rows] = conv_window[rows[:, None], pos]
    if ssm_steps.shape[1] == 0:
        return
    saved = ssm_steps[rows, acc.clamp(max=ssm_steps.shape[1] - 1)]
    keep_all = (acc >= counts.long())[:, None, None, None]
    ssm_state[rows] = torch.where(keep_all, ssm_state[rows].float(), saved).to(ssm_state.dtype)


def mamba_verify_ref(
    xbc: torch.Tensor, dt: torch.Tensor, conv_weight: torch.Tensor, conv_bias: torch.Tensor | None,
    A: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor,
    ssm_steps: torch.Tensor, rows: list[int], query_start_loc: list[int], *, d_inner: int, num_heads: int,
    head_dim: int, n_groups: int, d_state: int, activation: str | None = "silu",
    dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> torch.Tensor:
    """Verification requests (each continues from its row's state) position by position,
    with the single-token update a plain decode uses, so a kept position computes exactly
    what decoding it alone would. Writes the state after the last position to the row and
    the SSM state after each of the first k positions to ``ssm_steps[row, j]``.
    ``query_start_loc`` (host) bounds each request's tokens in ``xbc`` [T, conv_dim] and
    ``dt`` [T, H]. Returns y [T, H, P] float32 (zero outside the requests)."""
    gn = n_groups * d_state
    y = torch.zeros(xbc.shape[0], num_heads, head_dim, dtype=torch.float32, device=xbc.device)
    for i, row in enumerate(rows):
        cs, ss = conv_state[row: row + 1], ssm_state[row: row + 1].float()
        for j, t in enumerate(range(query_start_loc[i], query_start_loc[i + 1])):
            out, cs = conv_step_ref(xbc[t: t + 1], conv_weight, conv_bias, cs, activation)
            xs, Bs, Cs = out.split([d_inner, gn, gn], dim=-1)
            yt, ss = ssm_step_ref(ss, xs.reshape(1, num_heads, head_dim), dt[t: t + 1], A,
                                  Bs.reshape(1, n_groups, d_state), Cs.reshape(1, n_groups, d_state), D, dt_bias,
                                  dt_limit)
            y[t] = yt[0]
            if j < ssm_steps.shape[1]:
                ssm_steps[row, j] = ss[0]
        conv_state[row] = cs[0].to(conv_state.dtype)
        ssm_state[row] = ss[0].to(ssm_state.dtype)
    return y
