"""Speculative verification of the Mamba2 mixer (kernels/mamba_verify.py): the sequential
scan kernel's per-position states (``save_steps``) against the position-by-position torch
reference, in the interpreter and on a GPU; and the rollback: verifying 1 + k tokens then
committing ``accepted`` leaves exactly the state that feeding the accepted + 1 tokens one
decode step at a time leaves, for every accepted count."""
from __future__ import annotations

import pytest
import torch

from core_runner.kernels.mamba import mamba_varlen_ref
from core_runner.kernels.mamba_verify import commit_verified, mamba_verify_ref, stash_conv_window

H, P, N, G, K, KSPEC = 2, 4, 8, 1, 4, 3
D_INNER = H * P
CONV_DIM = D_INNER + 2 * G * N
SIZES = dict(d_inner=D_INNER, num_heads=H, head_dim=P, n_groups=G, d_state=N)


def _setup(seed: int, num_rows: int = 5, q_lens=(4, 3)):
    g = torch.Generator().manual_seed(seed)
    p = dict(A=-torch.rand(H, generator=g) - 0.1, D=torch.randn(H, generator=g),
             dt_bias=torch.randn(H, generator=g) * 0.5, weight=torch.randn(CONV_DIM, K, generator=g) * 0.5,
             bias=torch.randn(CONV_DIM, generator=g) * 0.1)
    T = sum(q_lens)
    b = dict(xbc=torch.randn(T, CONV_DIM, generator=g), dt=torch.randn(T, H, generator=g),
             conv=torch.randn(num_rows, K - 1, CONV_DIM, generator=g), ssm=torch.randn(num_rows, H, P, N, generator=g),
             qsl=[0] + torch.tensor(q_lens).cumsum(0).tolist())
    return p, b


def _verify_ref(p, b, rows):
    conv, ssm = b["conv"].clone(), b["ssm"].clone()
    steps = torch.zeros(conv.shape[0], KSPEC, H, P, N)
    y = mamba_verify_ref(b["xbc"], b["dt"], p["weight"], p["bias"], p["A"], p["D"], p["dt_bias"], conv, ssm, steps,
                         rows, b["qsl"], **SIZES)
    return y, conv, ssm, steps


def test_triton_save_steps_match_reference(device):
    from core_runner.kernels.mamba_triton import causal_conv1d_varlen_triton, ssm_scan_varlen_triton

    p, b = _setup(0)
    rows = [3, 1]
    y_ref, conv_ref, ssm_ref, steps_ref = _verify_ref(p, b, rows)
    to = dict(device=device)
    conv, ssm = b["conv"].clone().to(**to), b["ssm"].clone().to(**to)
    steps = torch.zeros(conv.shape[0], KSPEC, H, P, N, **to)
    r = torch.tensor(rows, dtype=torch.int32, **to)
    init = torch.ones(2, dtype=torch.bool, **to)
    qsl = torch.tensor(b["qsl"], dtype=torch.int32, **to)
    out = causal_conv1d_varlen_triton(b["xbc"].to(**to), p["weight"].to(**to), p["bias"].to(**to), conv, r, init, qsl)
    x, B, C = out.split([D_INNER, G * N, G * N], dim=-1)
    y = ssm_scan_varlen_triton(x, b["dt"].to(**to), p["A"].to(**to), B, C, p["D"].to(**to), p["dt_bias"].to(**to),
                               ssm, r, init, qsl, num_heads=H, head_dim=P, n_groups=G, d_state=N, save_steps=steps)
    tol = dict(atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(y.cpu(), y_ref, **tol)
    torch.testing.assert_close(conv.cpu(), conv_ref, **tol)
    torch.testing.assert_close(ssm.cpu(), ssm_ref, **tol)
    torch.testing.assert_close(steps.cpu(), steps_ref, **tol)
    # only the verified rows' slots are written
    assert torch.count_nonzero(steps.cpu()[[0, 2, 4]]) == 0 and torch.count_nonzero(steps.cpu()[[1, 3]]) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_triton_save_steps_on_gpu():
    test_triton_save_steps_match_reference("cuda")


@pytest.mark.parametrize("accepted", [0, 1, 2, 3])
def test_rollback_equals_feeding_the_accepted_tokens(accepted):
    p, b = _setup(1, q_lens=(4,))
    row = 2
    conv, ssm = b["conv"].clone(), b["ssm"].clone()
    win = torch.zeros(conv.shape[0], K + KSPEC, CONV_DIM)
    steps = torch.zeros(conv.shape[0], KSPEC, H, P, N)
    rows = torch.tensor([row])
    stash_conv_window(conv, win, b["xbc"], rows, torch.tensor([0]))
    mamba_verify_ref(b["xbc"], b["dt"], p["weight"], p["bias"], p["A"], p["D"], p["dt_bias"], conv, ssm, steps,
                     [row], b["qsl"], **SIZES)
    commit_verified(conv, ssm, win, steps, rows, torch.tensor([accepted]), torch.tensor([KSPEC]))
    # plain decoding of the kept tokens, one step each
    want_conv, want_ssm = b["conv"].clone(), b["ssm"].clone()
    for t in range(accepted + 1):
        mamba_varlen_ref(b["xbc"][t: t + 1], b["dt"][t: t + 1], p["weight"], p["bias"], p["A"], p["D"], p["dt_bias"],
                         want_conv, want_ssm, [row], [True], [0, 1], chunk_size=4, **SIZES)
    assert torch.equal(conv, want_conv) and torch.equal(ssm, want_ssm)
    others = [r for r in range(conv.shape[0]) if r != row]
    assert torch.equal(conv[others], b["conv"][others]) and torch.equal(ssm[others], b["ssm"][others])
