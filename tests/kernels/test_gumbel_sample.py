"""The Triton Gumbel-Max kernel draws the same tokens as the torch reference, from the
same uniforms bit for bit (native uint32 hash in the kernel, int64 halves in rng.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_runner.sample import rng
from core_runner.sample.gumbel import gumbel_sample_ref, inverse_temperature
from core_runner.sample.gumbel_triton import (
    _could_reach,
    _noise_of_hash,
    col_hash,
    gumbel_noise,
    gumbel_sample_triton,
    hash_uniform,
    row_keys,
    token_hash,
)


@triton.jit
def _noise_kernel(seed_ptr, pos_ptr, col_ptr, u_ptr, g_ptr, n_cols, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    k1, k2 = row_keys(seed_ptr, pos_ptr, i)
    offs = tl.arange(0, BLOCK)
    cols = tl.load(col_ptr + offs, mask=offs < n_cols, other=0)
    tl.store(g_ptr + i * n_cols + offs, gumbel_noise(col_hash(cols), k1, k2, False), mask=offs < n_cols)
    u = hash_uniform(col_hash(cols), k1, k2)
    tl.store(u_ptr + i * n_cols + offs, u, mask=offs < n_cols)


def test_kernel_noise_is_rng_noise_bit_for_bit(device):
    """uint32 arithmetic in Triton == the int64 16-bit-half products of rng.py, including
    negative and 64-bit seeds, position 2**32 - 1 (pos + 1 wraps) and u clamped below 1."""
    seeds = torch.tensor([0, 1, -1, -(2**63), 2**63 - 1, 2**40 + 7, 0], dtype=torch.int64)
    pos = torch.tensor([0, 5, 2**32 - 1, 2**32, 123456789, 7, 7], dtype=torch.int64)
    cols = torch.tensor([0, 1, 2, 63, 64, 1000, 65535, 124594, 151935, 2**20 + 3], dtype=torch.int64)
    u_ref = rng.uniform(seeds, pos, 2**20 + 4)[:, cols]
    g_ref = rng.gumbel(seeds, pos, 2**20 + 4)[:, cols]
    u = torch.empty(len(seeds), len(cols), device=device)
    g = torch.empty_like(u)
    d = lambda t: t.to(device)  # noqa: E731
    _noise_kernel[(len(seeds),)](d(seeds), d(pos), d(cols.to(torch.int32)), u, g, len(cols), BLOCK=16)
    assert torch.equal(u.cpu(), u_ref)
    assert torch.allclose(g.cpu(), g_ref, rtol=1e-6, atol=1e-6)
    # seed 0, position 7, column 124594: the top 24 hash bits are all ones, so
    # (2**24 - 1 + 0.5) / 2**24 rounds to 1.0 in float32; it is clamped to 1 - 2**-24
    assert u_ref[-1, 7] == rng.U_MAX and bool(torch.isfinite(g_ref).all())
    assert float(u_ref.max()) < 1.0


def _ref(logits, temp, seeds, pos):
    return gumbel_sample_ref(logits, inverse_temperature(temp), seeds, pos)


def test_rng_hash_matches_uint32_arithmetic():
    # the 16-bit-half product equals a wrapping uint32 multiply
    x = torch.tensor([0, 1, 0xFFFFFFFF, 0x12345678, 0xDEADBEEF], dtype=torch.int64)
    for c in (rng.GOLDEN, rng.M1, rng.M2):
        expect = torch.tensor([(int(v) * c) & 0xFFFFFFFF for v in x], dtype=torch.int64)
        assert torch.equal(rng.mul32(x, c), expect)


def test_kernel_matches_reference(device):
    g = torch.Generator().manual_seed(0)
    n, vocab = 8, 300  # vocab not a multiple of the tile
    logits = torch.randn(n, vocab, generator=g) * 3
    logits[2, 10:] = float("-inf")  # a row with few finite logits
    logits[4, [7, 70, 200]] = 50.0  # greedy ties: the first index wins (lanes 7 and 6 of 64)
    logits[6] = float("-inf")  # nothing finite: token 0, as torch's argmax
    logits[7, [150, 22]] = 60.0  # sampled: noise is continuous, but max is in the right place
    temp = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.0, 1.3, 0.8, 0.01])
    seeds = torch.tensor([1, 2, 3, 2**40 + 7, 5, 2**62, -9, 4], dtype=torch.int64)
    pos = torch.tensor([0, 9, 100, 4, 77, 123456, 3, 2], dtype=torch.int64)
    want = _ref(logits, temp, seeds, pos)
    got = gumbel_sample_triton(logits.to(device), inverse_temperature(temp).to(device), seeds.to(device),
                               pos.to(device), block=64)
    assert torch.equal(got.cpu(), want)
    assert int(got[2]) < 10 and int(got[6]) == 0 and int(got[7]) in (22, 150)
    assert int(got[0]) == int(logits[0].argmax()) and int(got[4]) == 7


def test_kernel_is_a_fair_sampler(device):
    # 400 draws over positions from a 3-token distribution: counts near softmax
    logits = torch.tensor([[0.0, 1.0, 2.0]]).repeat(400, 1)
    temp = torch.ones(400)
    seeds = torch.full((400,), 11, dtype=torch.int64)
    pos = torch.arange(400, dtype=torch.int64)
    got = gumbel_sample_triton(logits.to(device), inverse_temperature(temp).to(device), seeds.to(device),
                               pos.to(device), block=16)
    counts = torch.bincount(got.cpu(), minlength=3).float()
    expect = torch.softmax(logits[0], 0) * 400
    chi2 = float(((counts - expect) ** 2 / expect).sum())
    assert chi2 < 13.8  # p = 0.001 at 2 degrees of freedom


@triton.jit
def _bound_kernel(x_ptr, best_ptr, col_ptr, seed_ptr, pos_ptr, v_ptr, could_ptr, n_cols, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    k1, k2 = row_keys(seed_ptr, pos_ptr, i)
    offs = tl.arange(0, BLOCK)
    ok = offs < n_cols
    x = tl.load(x_ptr + i * n_cols + offs, mask=ok, other=0.0)
    best = tl.load(best_ptr + i * n_cols + offs, mask=ok, other=0.0)
    cols = tl.load(col_ptr + offs, mask=ok, other=0)
    h = token_hash(col_hash(cols), k1, k2)
    tl.store(v_ptr + i * n_cols + offs, x + _noise_of_hash(h, False), mask=ok)
    tl.store(could_ptr + i * n_cols + offs, _could_reach(x, h, best).to(tl.int32), mask=ok)


def test_noise_bound_never_skips_a_token_that_reaches_the_best(device):
    """The skip test of ``gumbel_pass``: a token whose noisy value reaches the row's best
    so far is never skipped (bests within +-1e-3 of the token's own noisy value, logits
    from -1e4 to 1e4), and far-below tokens are skipped (else the skip buys nothing)."""
    g = torch.Generator().manual_seed(3)
    n, n_cols = 16, 1024
    seeds = torch.randint(0, 2**40, (n,), generator=g)
    pos = torch.randint(0, 2**20, (n,), generator=g)
    cols = torch.randint(0, 151936, (n_cols,), generator=g)
    scale = torch.tensor([1.0, 10.0, 1e3, 1e4]).repeat(n // 4)[:, None]
    x = torch.randn(n, n_cols, generator=g) * scale
    noise = rng.gumbel(seeds, pos, 151936)[:, cols]
    near = x + noise + (torch.rand(n, n_cols, generator=g) - 0.5) * 2e-3  # the boundary
    far = x + 18.0 + torch.rand(n, n_cols, generator=g) * 10  # no noise reaches 16.64
    d = lambda t: t.to(device)  # noqa: E731
    for best, expect_skips in ((near, False), (far, True)):
        v = torch.empty(n, n_cols, device=device)
        could = torch.empty(n, n_cols, dtype=torch.int32, device=device)
        _bound_kernel[(n,)](d(x), d(best), d(cols.to(torch.int32)), d(seeds), d(pos), v, could, n_cols, BLOCK=1024)
        reach = v.cpu() >= best
        assert bool(could.cpu()[reach].all()), "a token that reaches the best was skipped"
        if expect_skips:
            assert float(could.float().mean()) < 0.01
        else:
            assert int(reach.sum()) > n_cols  # the case is exercised
    # a random token is skipped when the best is ~4 above it in most cases (P(g > 4) ~ 1.8%)
    could = torch.empty(n, n_cols, dtype=torch.int32, device=device)
    _bound_kernel[(n,)](d(x), d(x + 4.0), d(cols.to(torch.int32)), d(seeds), d(pos), v, could, n_cols, BLOCK=1024)
    assert float(could.float().mean()) < 0.08


def test_skipping_draws_the_reference_tokens_on_long_rows(device):
    """Many tiles per row (block 64, vocab 5000), so most tiles and tokens are skipped
    peaked and flat rows, huge logits, -inf stretches, a row whose best sits in the last
    tile, and exact ties of noisy values (identical columns are impossible, so ties come
    from -inf rows only): the tokens equal the reference's."""
    g = torch.Generator().manual_seed(4)
    n, vocab = 12, 5000
    logits = torch.randn(n, vocab, generator=g) * torch.tensor([0.1, 1, 3, 8, 20, 1, 1, 3, 1e3, 1, 2, 5])[:, None]
    logits[5, :4000] = float("-inf")
    logits[6, -3:] = 30.0  # the winner is in the last tile
    logits[7] += 1e4
    logits[9] = float("-inf")
    logits[10, ::7] = float("-inf")
    temp = torch.tensor([1.0, 1.0, 0.7, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 2.0, 0.0])
    seeds = torch.randint(0, 2**40, (n,), generator=g)
    pos = torch.randint(0, 1000, (n,), generator=g)
    want = _ref(logits, temp, seeds, pos)
    got = gumbel_sample_triton(logits.to(device), inverse_temperature(temp).to(device), seeds.to(device),
                               pos.to(device), block=64)
    assert torch.equal(got.cpu(), want)
    assert int(want[6]) >= vocab - 3 and int(want[5]) >= 4000 and int(want[9]) == 0


def test_rows_split_over_programs_draw_the_same_tokens(device):
    """split > 1: each row drawn by several programs over contiguous parts, then the
    parts' tokens combined: the same tokens as one program per row and the reference,
    also for a part that is all -inf, a row whose winner sits in the last part, greedy
    rows and a threshold."""
    g = torch.Generator().manual_seed(5)
    n, vocab = 8, 1000
    logits = torch.randn(n, vocab, generator=g) * torch.tensor([0.5, 1, 3, 8, 1, 2, 1, 4])[:, None]
    logits[1, :700] = float("-inf")  # with 4 parts (block 64: parts of 256) parts 0 and 1 hold nothing
    logits[2, -2:] = 40.0
    logits[5] = float("-inf")
    temp = torch.tensor([1.0, 1.0, 0.5, 1.0, 0.0, 1.0, 2.0, 0.0])
    seeds = torch.randint(0, 2**40, (n,), generator=g)
    pos = torch.randint(0, 1000, (n,), generator=g)
    inv = inverse_temperature(temp)
    d = lambda t: t.to(device)  # noqa: E731
    want = _ref(logits, temp, seeds, pos)
    thr = torch.full((n,), -2.0)
    want_thr = gumbel_sample_ref(logits, inv, seeds, pos, thr)
    for split in (2, 4, 7):
        got = gumbel_sample_triton(d(logits), d(inv), d(seeds), d(pos), block=64, split=split)
        assert torch.equal(got.cpu(), want), split
        got = gumbel_sample_triton(d(logits), d(inv), d(seeds), d(pos), threshold=d(thr), block=64, split=split)
        assert torch.equal(got.cpu(), want_thr), split
    assert int(want[5]) == 0 and int(want[1]) >= 700 and int(want[2]) >= vocab - 2
