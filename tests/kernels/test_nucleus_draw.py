"""The lane lists' draw among the nucleus (``lane_lists_triton._draw_in_nucleus``): the
bisection for v_p on all entries until at most NARROW are left at or above it, then on
those alone, moved to the front of the lists (which the entries were read from). Every
NARROW (0: never narrow) gives the token of a plain torch reference (sort, cumulative
mass, argmax of x + g over the nucleus), on both sides of the switch."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from core_runner.kernels.gumbel_sample import row_keys
from core_runner.kernels.lane_lists_triton import _draw_in_nucleus
from core_runner.sample import rng


@triton.jit
def _draw_kernel(x_ptr, i_ptr, seed_ptr, pos_ptr, out_ptr, m, target, big_t, N: tl.constexpr,
                 NARROW: tl.constexpr, ASM: tl.constexpr):
    r = tl.arange(0, N)
    big_t = big_t + tl.zeros([], tl.float32)  # (the interpreter passes floats as Python floats)
    m = m + tl.zeros([], tl.float32)
    target = target + tl.zeros([], tl.float32)
    x = tl.load(x_ptr + r)
    valid = x > big_t
    x = tl.where(valid, x, -float("inf"))
    w = tl.where(valid, tl.exp(x - m), 0.0)
    k1, k2 = row_keys(seed_ptr, pos_ptr, 0)
    tok = _draw_in_nucleus(x, w, i_ptr + r, valid, m, target, big_t, k1, k2, x_ptr, i_ptr, False, NARROW, ASM)
    tl.store(out_ptr, tok)


def _reference(x, cols, target, big_t, seed, pos, vocab):
    keep = x > big_t
    s, _ = torch.sort(x[keep], descending=True)
    cum = torch.cumsum(torch.exp(s - x.max()), 0)
    v_p = s[int((cum < target).sum())]
    g = rng.gumbel(torch.tensor([seed]), torch.tensor([pos]), vocab)[0][cols]
    noisy = torch.where(keep & (x >= v_p), x + g, torch.tensor(-float("inf")))
    return int(cols[int(torch.argmax(noisy))])


@pytest.mark.parametrize("p", [0.3, 0.9, 0.995])
def test_draw_in_nucleus_matches_the_reference_for_every_narrow_width(device, p):
    n, vocab = 128, 5000
    gen = torch.Generator().manual_seed(int(p * 1000))
    x = torch.randn(n, generator=gen) * 2.0
    x[::17] = -float("inf")  # empty list slots
    cols = torch.randperm(vocab, generator=gen)[:n].to(torch.int32)
    big_t = float(x[x > -float("inf")].kthvalue(20).values)  # entries at or under the bound are out
    m = float(x.max())
    target = p * float(torch.exp(x[x > big_t] - m).sum())
    seed, pos = 7, 3
    want = _reference(x, cols.long(), target, big_t, seed, pos, vocab)
    seeds = torch.tensor([seed], device=device)
    positions = torch.tensor([pos], device=device)
    moved = {}
    for asm in [False, True] if device == "cuda" else [False]:  # the move by inline PTX: GPU only
        for narrow in (0, 4, 16, 64, n):
            xd, cd = x.to(device).clone(), cols.to(device).clone()  # fresh copies: the draw overwrites them
            out = torch.empty(1, dtype=torch.int64, device=device)
            _draw_kernel[(1,)](xd, cd, seeds, positions, out, m, target, big_t, N=n, NARROW=narrow, ASM=asm)
            assert int(out) == want, (p, narrow, asm)
            moved[narrow] = not torch.equal(xd.cpu(), x)  # the narrow path moved the entries to the front
    assert moved[n] and not moved[0]  # all entries fit: narrow from the start; 0: never narrow
    if p >= 0.9:
        assert not moved[4]  # the nucleus alone is wider than 4: all entries to the end
