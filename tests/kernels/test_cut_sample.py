"""The Triton cut sampler (``cut_sample_triton``: read, decide, fallback) against the reference
path, threshold (``top_k_top_p_threshold_ref``) then Gumbel-Max (``gumbel_sample_ref``), token
for token, on rows the lane lists settle and rows that fall back. Interpreter on the CPU:
tiles of 32-64 columns and small candidate capacities keep it fast."""
from __future__ import annotations

import pytest
import torch

from core_runner.sample.gumbel import gumbel_sample_ref
from core_runner.sample.top_k_top_p import top_k_top_p_threshold_ref
from core_runner.sample.top_k_top_p_triton import cut_sample_triton

NEG_INF = float("-inf")


def _check(device, logits, inv, k, p, min_p, seed=0, block=64, parts=4, cap=128):
    """Sample on both paths; returns the fallback flags. ``k`` etc. may be lists."""
    n = logits.shape[0]
    t = lambda v, dt=torch.float32: torch.as_tensor(v, dtype=dt)  # noqa: E731
    inv, k, p, lmp = t(inv), t(k, torch.int32), t(p), t(min_p).log()
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 2**40, (n,), generator=g)
    pos = torch.randint(0, 1000, (n,), generator=g)
    want = gumbel_sample_ref(logits, inv, seeds, pos, top_k_top_p_threshold_ref(logits, inv, k, p, lmp))
    d = lambda x: x.to(device)  # noqa: E731
    got, flags = cut_sample_triton(d(logits), d(inv), d(seeds), d(pos), d(k), d(p), d(lmp), block=block,
                                   parts=parts, cap=cap, with_flags=True)
    assert torch.equal(got.cpu(), want), (got.cpu() != want).nonzero().flatten().tolist()
    return flags.cpu().tolist()


def test_peaked_rows_are_settled_by_the_lists(device):
    """The benchmark's kind of row (N(0, 4^2) logits, temperature 0.7, top-p 0.9), plus top-k,
    top-k + top-p and min-p with top-p: no fallback; vocab not a tile multiple."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 1999, generator=g) * 8
    inv = [1 / 0.7] * 4
    flags = _check(device, logits, inv, [-1, 5, 20, -1], [0.9, 1.0, 0.8, 0.9], [0.0, 0.0, 0.0, 0.1], seed=2)
    assert flags == [0, 0, 0, 0]


def test_rows_that_fall_back(device):
    """A flat row (its nucleus runs below G), top-k beyond the candidates, min-p below G:
    the fallback's pivot search and masked pass give the reference tokens."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 700, generator=g)
    logits[1:] *= 6
    flags = _check(device, logits, [1.0, 1.0, 1.0], [-1, 400, -1], [0.9, 1.0, 1.0], [0.0, 0.0, 1e-4],
                   block=32, cap=64)
    assert flags == [1, 1, 1]


def test_mixed_batch_with_ties_and_minus_inf(device):
    """Greedy, temperature-only and cut rows in one batch; ties at the k-th value and at the
    maximum, -inf tails, a row of -inf only, top-k >= vocab, top-k >= the finite tokens, min-p
    alone and top-k + top-p."""
    g = torch.Generator().manual_seed(4)
    n, vocab = 10, 300
    logits = torch.randn(n, vocab, generator=g) * 5
    logits[2] = torch.randint(0, 6, (vocab,), generator=g).float()  # heavy ties
    logits[3, :5] = 40.0  # five tied maxima
    logits[4, 50:] = NEG_INF  # 50 finite tokens
    logits[5] = NEG_INF
    logits[6, ::3] = NEG_INF
    inv = [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.3, 0.8, 1.0, 2.0]
    k = [5, -1, 3, 2, 100, 5, vocab + 4, -1, 7, 4]
    p = [0.5, 1.0, 0.5, 1.0, 0.9, 0.9, 1.0, 1.0, 0.6, 0.99]
    min_p = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.0, 0.05]
    flags = _check(device, logits, inv, k, p, min_p, seed=5, block=32, cap=64)
    assert flags[0] == flags[1] == flags[6] == 0  # greedy, no cut, top-k >= vocab: drawn in the read
    assert flags[5] == 1  # nothing finite


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_default_shape_on_the_gpu():
    """The default launch shape on the benchmark's row shape (a few rows), peaked and flat."""
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(16, 151936, generator=g) * 4
    logits[8:] /= 4  # flat rows: N(0, 1)
    flags = _check("cuda", logits, [1 / 0.7] * 16, [-1] * 16, [0.9] * 16, [0.0] * 16, seed=7,
                   block=512, parts=8, cap=1024)
    assert flags[:8] == [0] * 8 and flags[8:] == [1] * 8


def test_bf16_logits_are_read_in_place(device):
    """The Triton pipeline reads bf16 logits in their own dtype (no [n, V] float32 copy) and
    draws the tokens the torch path draws from the same values widened to float32: greedy,
    temperature-only and cut rows, with and without a logit bias."""
    from core_runner.sample.gumbel import Draw
    from core_runner.sample.sampler import StepInputs, sample_inputs
    from core_runner.sample.top_k_top_p import Cuts

    g = torch.Generator().manual_seed(9)
    n, vocab = 6, 500
    logits = (torch.randn(n, vocab, generator=g) * 6).to(torch.bfloat16)
    inv = torch.tensor([0.0, 1.4, 1.4, 1.0, 2.0, 1.4])
    seeds, pos = torch.randint(0, 2**40, (n,), generator=g), torch.randint(0, 999, (n,), generator=g)
    cuts = Cuts(torch.tensor([-1, -1, 5, -1, 30, -1], dtype=torch.int32), torch.tensor([1.0, 1.0, 1.0, 0.9, 0.8, 1.0]),
                torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.2]).log())
    d = lambda x: x.to(device)  # noqa: E731
    for with_cuts in (False, True):
        want = sample_inputs(logits, StepInputs(Draw(inv, seeds, pos), cuts if with_cuts else None)).sampled
        dcuts = Cuts(d(cuts.top_k), d(cuts.top_p), d(cuts.log_min_p)) if with_cuts else None
        got = sample_inputs(d(logits), StepInputs(Draw(d(inv), d(seeds), d(pos)), dcuts), use_triton=True).sampled
        assert torch.equal(got.cpu(), want), with_cuts
