"""The Triton cut sampler (``cut_sample_triton``: read, decide, split fallback, serial last resort)
against the reference path, threshold (``top_k_top_p_threshold_ref``) then Gumbel-Max
(``gumbel_sample_ref``), token for token and threshold for threshold, on rows the decide settles
and rows that fall back. Interpreter on the CPU: tiles of 32-64 columns, small part / collect
capacities and chunks keep it fast."""
from __future__ import annotations

import pytest
import torch

from core_runner.sample.gumbel import gumbel_sample_ref
from core_runner.sample.top_k_top_p import top_k_top_p_threshold_ref
from core_runner.sample.top_k_top_p_triton import cut_sample_triton

NEG_INF = float("-inf")
SERIAL = 7  # final step of a row the serial last resort settled
SMALL = dict(block=32, parts=4, pcap=16, cap=64, chunk=64)  # a part hands over <= 16 entries: 64 a row


def _check(device, logits, inv, k, p, min_p, seed=0, **shape):
    """Sample on both paths; returns (flags, final steps). ``k`` etc. may be lists. The kernel's
    thresholds equal the reference's, except that a top-k at or beyond the finite tokens may
    read as the smallest finite value instead of no cut: the same tokens kept."""
    n = logits.shape[0]
    t = lambda v, dt=torch.float32: torch.as_tensor(v, dtype=dt)  # noqa: E731
    inv, k, p, lmp = t(inv), t(k, torch.int32), t(p), t(min_p).log()
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 2**40, (n,), generator=g)
    pos = torch.randint(0, 1000, (n,), generator=g)
    thr_ref = top_k_top_p_threshold_ref(logits, inv, k, p, lmp)
    want = gumbel_sample_ref(logits, inv, seeds, pos, thr_ref)
    d = lambda x: x.to(device)  # noqa: E731
    got, flags, thr, steps = (r.cpu() for r in cut_sample_triton(d(logits), d(inv), d(seeds), d(pos), d(k), d(p),
                                                                  d(lmp), details=True, **shape))
    assert torch.equal(got, want), (got != want).nonzero().flatten().tolist()
    x = logits.float() * inv[:, None]
    kept_same = ((x >= thr[:, None]) == (x >= thr_ref[:, None])).all(dim=1)
    assert bool(kept_same.all()), ((~kept_same).nonzero().flatten().tolist(), thr, thr_ref)
    k_beyond = k >= (x > NEG_INF).sum(dim=1)
    assert torch.equal(thr[~k_beyond], thr_ref[~k_beyond]), (thr, thr_ref)
    return flags.tolist(), steps.tolist()


def test_peaked_rows_are_settled_by_the_lists(device):
    """The benchmark's kind of row (N(0, 4^2) logits, temperature 0.7, top-p 0.9), plus top-k,
    top-k + top-p and min-p with top-p: no fallback; vocab not a tile multiple."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 1999, generator=g) * 8
    inv = [1 / 0.7] * 4
    flags, _ = _check(device, logits, inv, [-1, 5, 20, -1], [0.9, 1.0, 0.8, 0.9], [0.0, 0.0, 0.0, 0.1], seed=2,
                      block=64, parts=4, pcap=32)
    assert flags == [0, 0, 0, 0]


def _fallback_rows():
    """Rows the decide cannot settle at SMALL's shape, one per reason: a flat row (its nucleus
    runs below G), top-k beyond the candidates but within the sorted entries then top-p (which
    collects the k kept tokens at once), top-k beyond the sorted entries (the stats step first),
    min-p below G, a nucleus wider than the candidates, and top-k beyond the sorted entries then
    top-p (searched); plus two peaked rows the decide settles."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 700, generator=g)
    logits[1:3] *= 6
    logits[3] *= 2
    logits[6:] *= 8
    inv = [1.0, 1.0, 1.0, 1.0, 1.0, 1.3, 1 / 0.7, 1.0]
    k = [-1, 60, 400, -1, -1, 300, -1, 5]
    p = [0.9, 0.9, 1.0, 1.0, 0.999, 0.8, 0.9, 1.0]
    min_p = [0.0, 0.0, 0.0, 0.01, 0.0, 0.0, 0.0, 0.0]
    return logits, inv, k, p, min_p


def test_rows_that_fall_back_are_settled_by_the_split_rounds(device):
    """Every fallback reason, mixed with rows the decide settles: the split rounds (pivot
    counts, collect, draw) give the reference tokens and thresholds without the last resort."""
    flags, steps = _check(device, *_fallback_rows(), seed=4, rounds=8, **SMALL)
    assert flags == [1, 1, 1, 1, 1, 1, 0, 0]
    assert steps == [0] * 8


def test_split_rounds_with_one_chunk_a_row(device):
    """A vocab inside one chunk: each round's only item of a row is also its finisher."""
    flags, steps = _check(device, *_fallback_rows(), seed=4, rounds=8, **{**SMALL, "chunk": 1024})
    assert flags == [1, 1, 1, 1, 1, 1, 0, 0] and steps == [0] * 8


@pytest.mark.parametrize("rounds", [0, 2])
def test_rows_left_after_the_rounds_take_the_last_resort(device, rounds):
    """With no split rounds every flagged row takes the serial last resort; with two, the rows
    still unsettled do (from any step): the same tokens either way."""
    flags, steps = _check(device, *_fallback_rows(), seed=4, rounds=rounds, **SMALL)
    assert flags == [1, 1, 1, 1, 1, 1, 0, 0]
    if rounds == 0:
        assert steps == [SERIAL] * 6 + [0, 0]
    else:
        assert steps[3] == 0 and SERIAL in steps  # min-p below G: one draw round


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
    flags, steps = _check(device, logits, inv, k, p, min_p, seed=5, rounds=8, **SMALL)
    assert flags[0] == flags[1] == flags[6] == 0  # greedy, no cut, top-k >= vocab: drawn in the read
    assert flags[5] == 0  # nothing finite: column 0, as the reference's argmax
    assert steps == [0] * n


def test_heavy_ties_in_the_split_search(device):
    """Flat rows of few distinct values (bf16-like rounding, many tokens per value): the
    brackets end on one key or on tied tokens; top-p and top-k thresholds fall on ties."""
    g = torch.Generator().manual_seed(8)
    logits = (torch.randn(4, 900, generator=g) * 2).round(decimals=1)
    logits[1] = torch.randint(0, 12, (900,), generator=g).float() * 0.25
    flags, steps = _check(device, logits, [1.0, 1.0, 1.0, 0.7], [-1, -1, 200, 120], [0.9, 0.95, 0.9, 1.0],
                          [0.0, 0.0, 0.0, 0.0], seed=9, rounds=8, **SMALL)
    assert flags == [1, 1, 1, 1] and steps == [0] * 4


def test_constant_rows_and_bf16_rows_that_fall_back(device):
    """Rows of one value (no entry lies above any cut: every search ends on one key), of two
    values, and flat bf16 rows read in their own dtype by every step."""
    g = torch.Generator().manual_seed(10)
    logits = torch.randn(6, 640, generator=g)
    logits[0] = 1.5
    logits[1] = 1.5
    logits[2] = torch.where(logits[2] > 0, 2.0, -1.0)
    flags, steps = _check(device, logits, [1.0] * 6, [-1, 5, -1, -1, 90, -1], [0.9, 1.0, 0.8, 0.9, 1.0, 1.0],
                          [0.0, 0.0, 0.0, 0.0, 0.0, 0.3], seed=11, rounds=8, **SMALL)
    assert flags[:3] == [1, 1, 1] and steps == [0] * 6
    flags, steps = _check(device, logits[3:].to(torch.bfloat16), [1.3] * 3, [-1, 90, -1], [0.9, 1.0, 1.0],
                          [0.0, 0.0, 0.05], seed=12, rounds=8, **SMALL)
    assert flags == [1, 1, 1] and steps == [0] * 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_default_shape_on_the_gpu():
    """The default launch shape on the benchmark's row shape (a few rows), peaked and flat:
    the flat rows are settled by the split rounds."""
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(16, 151936, generator=g) * 4
    logits[8:] /= 4  # flat rows: N(0, 1)
    flags, steps = _check("cuda", logits, [1 / 0.7] * 16, [-1] * 16, [0.9] * 16, [0.0] * 16, seed=7)
    assert flags[:8] == [0] * 8 and flags[8:] == [1] * 8
    assert steps == [0] * 16


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
