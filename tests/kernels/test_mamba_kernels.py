"""Mamba2 kernels: the chunked torch scan against the token-by-token recurrence, and the
Triton conv / scan kernels (recurrence and chunked SSD scan) against the torch references over ragged batches (decode
rows, fresh prefills, continued chunks, padded requests, dummy runs)."""
from __future__ import annotations

import pytest
import torch

from core_runner.kernels.mamba import (
    causal_conv1d_ref,
    conv_step_ref,
    mamba_varlen_ref,
    ssd_chunk_scan_ref,
    ssm_step_ref,
)

H, P, N, G, K = 4, 8, 16, 2, 4
D_INNER = H * P
CONV_DIM = D_INNER + 2 * G * N


def _params(gen: torch.Generator):
    return dict(
        A=-torch.rand(H, generator=gen) * 2 - 0.1,
        D=torch.randn(H, generator=gen),
        dt_bias=torch.randn(H, generator=gen) * 0.5,
        weight=torch.randn(CONV_DIM, K, generator=gen) * 0.5,
        bias=torch.randn(CONV_DIM, generator=gen) * 0.1,
    )


def _sequential(x, dt, A, B, C, D, dt_bias, state, dt_limit=(0.0, float("inf"))):
    ys = []
    s = torch.zeros(1, H, P, N) if state is None else state[None].clone()
    for t in range(x.shape[0]):
        y, s = ssm_step_ref(s, x[t][None], dt[t][None], A, B[t][None], C[t][None], D, dt_bias, dt_limit)
        ys.append(y[0])
    return torch.stack(ys), s[0]


@pytest.mark.parametrize("length,chunk", [(1, 4), (7, 4), (8, 4), (13, 8), (20, 3), (9, 64)])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_scan_equals_recurrence(length, chunk, with_state):
    g = torch.Generator().manual_seed(length * 31 + chunk)
    p = _params(g)
    x = torch.randn(length, H, P, generator=g)
    dt = torch.randn(length, H, generator=g)
    B, C = torch.randn(length, G, N, generator=g), torch.randn(length, G, N, generator=g)
    s0 = torch.randn(H, P, N, generator=g) if with_state else None
    y, s = ssd_chunk_scan_ref(x, dt, p["A"], B, C, p["D"], p["dt_bias"], s0, chunk)
    y_ref, s_ref = _sequential(x, dt, p["A"], B, C, p["D"], p["dt_bias"], s0)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s, s_ref, atol=1e-5, rtol=1e-5)


def test_chunked_scan_dt_limit():
    g = torch.Generator().manual_seed(2)
    p = _params(g)
    x, dt = torch.randn(11, H, P, generator=g), torch.randn(11, H, generator=g) * 3
    B, C = torch.randn(11, G, N, generator=g), torch.randn(11, G, N, generator=g)
    y, s = ssd_chunk_scan_ref(x, dt, p["A"], B, C, p["D"], p["dt_bias"], None, 4, (0.2, 1.5))
    y_ref, s_ref = _sequential(x, dt, p["A"], B, C, p["D"], p["dt_bias"], None, (0.2, 1.5))
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s, s_ref, atol=1e-5, rtol=1e-5)


def test_conv_chunks_equal_whole_and_steps():
    g = torch.Generator().manual_seed(3)
    p = _params(g)
    x = torch.randn(12, CONV_DIM, generator=g)
    whole, st_whole = causal_conv1d_ref(x, p["weight"], p["bias"], None)
    a, st = causal_conv1d_ref(x[:5], p["weight"], p["bias"], None)
    b, st = causal_conv1d_ref(x[5:6], p["weight"], p["bias"], st)  # a chunk shorter than K - 1
    outs = [a, b]
    for t in range(6, 12):
        o, st2 = conv_step_ref(x[t][None], p["weight"], p["bias"], st[None])
        st = st2[0]
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs), whole, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(st, st_whole)


# ---------------------------------------------------------------------------------
# Triton kernels vs the references (interpreter on the CPU)
# ---------------------------------------------------------------------------------
def _batch(device, q_lens, has_init, rows, num_rows, gen, pad_reqs=0, pad_tokens=0):
    """A ragged step: q_lens per request (decode rows first), plus padded requests (empty
    queries, scratch row) and padded tokens past the last request."""
    T = sum(q_lens) + pad_tokens
    qsl = [0]
    for q in q_lens + [0] * pad_reqs:
        qsl.append(qsl[-1] + q)
    scratch = num_rows - 1
    batch = dict(
        xbc=torch.randn(T, CONV_DIM, generator=gen),
        dt=torch.randn(T, H, generator=gen),
        rows=rows + [scratch] * pad_reqs,
        has_init=has_init + [False] * pad_reqs,
        qsl=qsl,
        conv_state=torch.randn(num_rows, K - 1, CONV_DIM, generator=gen),
        ssm_state=torch.randn(num_rows, H, P, N, generator=gen),
    )
    return batch


def _run_ref(b, p, write_state=True, chunk=4):
    conv, ssm = b["conv_state"].clone(), b["ssm_state"].clone()
    y = mamba_varlen_ref(
        b["xbc"], b["dt"], p["weight"], p["bias"], p["A"], p["D"], p["dt_bias"], conv, ssm,
        b["rows"], b["has_init"], b["qsl"], d_inner=D_INNER, num_heads=H, head_dim=P, n_groups=G, d_state=N,
        chunk_size=chunk, write_state=write_state,
    )
    return y, conv, ssm


def _run_triton(b, p, device, write_state=True, scan="seq"):
    """scan: "seq" (the recurrence kernel) or "ssd" (the chunked scan, chunks of 4)."""
    from core_runner.kernels.mamba_ssd_triton import ssd_chunk_scan_varlen_triton
    from core_runner.kernels.mamba_triton import causal_conv1d_varlen_triton, ssm_scan_varlen_triton

    to = dict(device=device)
    conv, ssm = b["conv_state"].clone().to(**to), b["ssm_state"].clone().to(**to)
    rows = torch.tensor(b["rows"], dtype=torch.int32, **to)
    init = torch.tensor(b["has_init"], dtype=torch.bool, **to)
    qsl = torch.tensor(b["qsl"], dtype=torch.int32, **to)
    proj = torch.randn(b["xbc"].shape[0], 5 + CONV_DIM + H)  # strided views like the layer's split
    proj[:, 5:5 + CONV_DIM] = b["xbc"]
    proj[:, 5 + CONV_DIM:] = b["dt"]
    proj = proj.to(**to)
    xbc, dt = proj[:, 5:5 + CONV_DIM], proj[:, 5 + CONV_DIM:]
    out = causal_conv1d_varlen_triton(xbc, p["weight"].to(**to), p["bias"].to(**to), conv, rows, init, qsl,
                                      write_state=write_state)
    x, B, C = out.split([D_INNER, G * N, G * N], dim=-1)
    kw = dict(chunk_size=4) if scan == "ssd" else {}
    y = (ssd_chunk_scan_varlen_triton if scan == "ssd" else ssm_scan_varlen_triton)(
        x, dt, p["A"].to(**to), B, C, p["D"].to(**to), p["dt_bias"].to(**to), ssm, rows, init, qsl,
        num_heads=H, head_dim=P, n_groups=G, d_state=N, write_state=write_state, **kw,
    )
    return y.cpu(), conv.cpu(), ssm.cpu()


CASES = {
    # decode rows only (the single-step update)
    "decode": dict(q_lens=[1, 1, 1], has_init=[True, True, True], rows=[2, 0, 4]),
    # decode rows first, then a fresh prompt, a continued chunk, a chunk shorter than K - 1
    "mixed": dict(q_lens=[1, 1, 9, 6, 2, 1], has_init=[True, True, False, True, True, False], rows=[3, 1, 0, 2, 4, 5]),
    # graph padding: empty scratch-row requests and padded tokens
    "padded": dict(q_lens=[1, 5], has_init=[True, True], rows=[1, 0], pad_reqs=3, pad_tokens=4),
}


@pytest.mark.parametrize("scan", ["seq", "ssd"])
@pytest.mark.parametrize("case", list(CASES))
def test_triton_conv_and_scan_match_reference(device, case, scan):
    g = torch.Generator().manual_seed(len(case))
    p = _params(g)
    b = _batch(device, num_rows=7, gen=g, **CASES[case])
    y_ref, conv_ref, ssm_ref = _run_ref(b, p)
    y, conv, ssm = _run_triton(b, p, device, scan=scan)
    T_real = b["qsl"][-1]
    torch.testing.assert_close(y[:T_real], y_ref[:T_real], atol=2e-5, rtol=1e-5)
    assert torch.count_nonzero(y[T_real:]) == 0 and torch.count_nonzero(y_ref[T_real:]) == 0
    torch.testing.assert_close(conv, conv_ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ssm, ssm_ref, atol=2e-5, rtol=1e-5)
    # rows not in the batch, and the scratch row under padding, are untouched
    used = set(CASES[case]["rows"])
    for r in range(7):
        if r not in used:
            assert torch.equal(conv[r], b["conv_state"][r]) and torch.equal(ssm[r], b["ssm_state"][r]), r


@pytest.mark.parametrize("scan", ["seq", "ssd"])
def test_triton_dummy_run_writes_no_state(device, scan):
    g = torch.Generator().manual_seed(9)
    p = _params(g)
    b = _batch(device, q_lens=[3, 4], has_init=[False, False], rows=[6, 6], num_rows=7, gen=g, pad_tokens=2)
    y, conv, ssm = _run_triton(b, p, device, write_state=False, scan=scan)
    y_ref, _, _ = _run_ref(b, p, write_state=False)
    torch.testing.assert_close(y, y_ref, atol=2e-5, rtol=1e-5)
    assert torch.equal(conv, b["conv_state"]) and torch.equal(ssm, b["ssm_state"])


@pytest.mark.parametrize("prefill_scan", ["seq", "ssd"])
def test_triton_decode_loop_matches_chunked_prefill(device, prefill_scan):
    """Prefill 10 tokens in Triton, then 5 single-token steps (the layer's dispatch: the
    chunked scan when the step has prefill tokens, else the recurrence): equals one
    reference chunked scan over all 15 tokens."""
    g = torch.Generator().manual_seed(11)
    p = _params(g)
    L = 15
    full = _batch(device, q_lens=[L], has_init=[False], rows=[0], num_rows=2, gen=g)
    y_ref, conv_ref, ssm_ref = _run_ref(full, p, chunk=4)
    state = dict(full)
    ys = []
    for s, e in [(0, 10)] + [(t, t + 1) for t in range(10, L)]:
        step = dict(state, xbc=full["xbc"][s:e], dt=full["dt"][s:e], qsl=[0, e - s], has_init=[s > 0])
        y, conv, ssm = _run_triton(step, p, device, scan=prefill_scan if e - s > 1 else "seq")
        ys.append(y)
        state["conv_state"], state["ssm_state"] = conv, ssm
    torch.testing.assert_close(torch.cat(ys), y_ref, atol=3e-5, rtol=1e-5)
    torch.testing.assert_close(state["conv_state"][0], conv_ref[0])
    torch.testing.assert_close(state["ssm_state"][0], ssm_ref[0], atol=3e-5, rtol=1e-5)
