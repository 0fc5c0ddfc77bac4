"""The sampler probe (``benchmarks/sampler_probe.py``) runs every variant and its bare
read computes the row max, so a GPU call spent on it returns numbers, not a crash."""
from __future__ import annotations

import torch

from benchmarks.sampler_probe import probe
from core_runner.kernels.gumbel_sample import gumbel_sample_triton


def test_probe_variants_run_and_read_finds_the_row_max(device):
    x = (torch.randn(3, 300) * 4).to(device)
    n = x.shape[0]
    tokens = gumbel_sample_triton(x, torch.full((n,), 1.0 / 0.7, device=device), torch.arange(n, device=device),
                                  torch.full((n,), 100, device=device))
    outs = {}
    for mode in ("read", "hash", "bound", "full", "fullz", "stats", "lists3", "lists3nt", "lists2"):
        for split in (1, 2):
            out = outs[mode, split] = probe(x, mode, split, block=64, num_warps=4).view(3, -1)
            assert bool(torch.isfinite(out).all())
            if mode == "read":
                torch.testing.assert_close(out.max(1).values, (x * (1.0 / 0.7)).max(1).values)
            if mode == "full" and split == 1:  # the probe's full pass draws the sampler's tokens
                assert out[:, 0].long().tolist() == tokens.tolist(), mode
    for split in (1, 2):  # with or without tile maxima: the same entries, max and mass (lists3 adds the maxima)
        part = -(-(-(-x.shape[1] // split)) // 64) * 64  # the probe's parts: whole tiles of 64
        maxima = torch.stack([(x[:, s * part:(s + 1) * part] * (1.0 / 0.7)).amax(1) for s in range(split)], 1)
        torch.testing.assert_close(outs["lists3", split] - outs["lists3nt", split], maxima, rtol=1e-5, atol=1e-4)
