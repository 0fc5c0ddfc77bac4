"""The Triton Gumbel-Max kernel draws the same tokens as the torch reference."""
from __future__ import annotations

import torch

from core_runner.kernels.gumbel_sample import gumbel_sample_triton
from core_runner.sample import rng
from core_runner.sample.sampler import gumbel_sample_ref, inverse_temperature


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
    n, vocab = 6, 300  # vocab not a multiple of the tile
    logits = torch.randn(n, vocab, generator=g) * 3
    logits[2, 10:] = float("-inf")  # a row with few finite logits
    temp = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.0, 1.3])
    seeds = torch.tensor([1, 2, 3, 2**40 + 7, 5, 2**62], dtype=torch.int64)
    pos = torch.tensor([0, 9, 100, 4, 77, 123456], dtype=torch.int64)
    want = _ref(logits, temp, seeds, pos)
    got = gumbel_sample_triton(logits.to(device), inverse_temperature(temp).to(device), seeds.to(device),
                               pos.to(device), block=64)
    assert torch.equal(got.cpu(), want)
    assert int(got[2]) < 10
    assert int(got[0]) == int(logits[0].argmax()) and int(got[4]) == int(logits[4].argmax())


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
