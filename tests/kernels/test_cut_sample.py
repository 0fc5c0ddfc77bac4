"""The fused cut sampler (``cut_sample_triton``) against the reference path: threshold
(``top_k_top_p_threshold_ref``) then Gumbel-Max (``gumbel_sample_ref``), token for token,
on every route a row can take: draw kept (1), redrawn from the stored candidates or under
the min-p mask (2), exact pivot search (3, forced with a small candidate capacity).
Interpreter on the CPU: tiles of 64 columns, vocabularies that are not a tile multiple."""
from __future__ import annotations

import pytest
import torch

import core_runner.kernels.cut_sample_split_triton as cs
from core_runner.kernels.cut_sample_triton import sample_with_cuts_triton
from core_runner.kernels.top_k_top_p import top_k_top_p_threshold_ref
from core_runner.sample.sampler import gumbel_sample_ref

NEG_INF = float("-inf")


def _reference(logits, inv, k, p, lmp, seeds, pos):
    thr = top_k_top_p_threshold_ref(logits, inv, k, p, lmp)
    return gumbel_sample_ref(logits, inv, seeds, pos, thr)


def _run(device, logits, inv, k, p, lmp, seeds, pos, cap=64, split=1, nucleus_first=False, **kw):
    paths = torch.empty(logits.shape[0], dtype=torch.int32, device=device)
    got = sample_with_cuts_triton(*(t.to(device) for t in (logits, inv, seeds, pos, k, p, lmp)), block=64, cap=cap,
                                  search_block=32, paths=paths, split=split,
                                  nucleus_first=nucleus_first, **kw)
    return got.cpu(), paths.cpu()


def _mixed_rows(seed, n=40, vocab=200):
    """Random scales, ties, -inf tails, tied maxima, greedy rows, and every cut alone and
    combined (top-k only, top-p only, min-p only, pairs, all three)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g) * (torch.rand(n, 1, generator=g) * 4 + 0.3)
    logits[::5] = logits[::5].round()  # ties everywhere
    logits[3::7, 100:] = NEG_INF
    logits[4::11, :3] = 25.0  # three tied maxima
    inv = 1 / (torch.rand(n, generator=g) * 1.5 + 0.2)
    inv[::9] = 0.0  # greedy
    mode = torch.arange(n) % 8  # bit 0: top-k, bit 1: top-p, bit 2: min-p
    k = torch.where(mode & 1 > 0, torch.randint(1, 40, (n,), generator=g), -1).to(torch.int32)
    p = torch.where(mode & 2 > 0, torch.rand(n, generator=g) * 0.9 + 0.05, 1.0)
    min_p = torch.where(mode & 4 > 0, torch.rand(n, generator=g) * 0.3 + 0.01, 0.0)
    seeds = torch.randint(0, 2**40, (n,), generator=g)
    pos = torch.randint(0, 1000, (n,), generator=g)
    return logits, inv, k, p, min_p.log(), seeds, pos


@pytest.mark.parametrize("cap, seed", [(64, 0), (8, 1)])
def test_cut_sampler_equals_reference_on_every_path(device, cap, seed):
    args = _mixed_rows(seed)
    got, paths = _run(device, *args, cap=cap)
    want = _reference(*args)
    assert torch.equal(got, want), (got != want).nonzero().flatten().tolist()
    assert ({0, 1, 2} if cap == 64 else {1, 3}) <= set(paths.tolist()), paths


def test_ties_at_the_boundaries(device):
    """Values from {0, .., 4}: the k-th token and the token that completes the top-p mass
    sit in tie groups, and many draws land in those groups (the whole group is kept)."""
    g = torch.Generator().manual_seed(2)
    n, vocab = 36, 130
    logits = torch.randint(0, 5, (n, vocab), generator=g).float()
    logits[:, 129] = NEG_INF
    inv = torch.full((n,), 1.0)
    k = torch.tensor([3, 40, -1, -1, 7, 30] * 6, dtype=torch.int32)
    p = torch.tensor([1.0, 1.0, 0.5, 0.8, 0.6, 0.9] * 6)
    lmp = torch.full((n,), NEG_INF)
    seeds = torch.full((n,), 77, dtype=torch.int64)
    pos = torch.arange(n, dtype=torch.int64)
    thr = top_k_top_p_threshold_ref(logits, inv, k, p, lmp)
    assert bool(((logits == thr[:, None]).sum(1) > 1).all()), "every cut should fall inside a tie group"
    got, paths = _run(device, logits, inv, k, p, lmp, seeds, pos)
    assert torch.equal(got, _reference(logits, inv, k, p, lmp, seeds, pos))
    assert {1, 2} <= set(paths.tolist())


def test_top_k_bound_when_one_lane_holds_the_top_tokens(device):
    """The eight largest logits share lane 0 (columns 0, 64, ..): the lanes' top-two lists
    miss six of them, so L < v_k, Z_B is unknown after read 2 and top-k + top-p rows are
    settled from the candidates {x >= L}."""
    g = torch.Generator().manual_seed(3)
    n, vocab = 6, 520
    logits = torch.randn(n, vocab, generator=g)
    logits[:, ::64] = 6.0 + torch.arange(9).float() * 0.25  # nine in lane 0
    inv = torch.ones(n)
    k = torch.tensor([8, 8, 8, 5, 9, 8], dtype=torch.int32)
    p = torch.tensor([0.9, 0.5, 0.99, 0.7, 0.95, 1.0])
    lmp = torch.full((n,), NEG_INF)
    lmp[5] = torch.tensor(0.05).log()
    seeds = torch.arange(n, dtype=torch.int64) + 100
    pos = torch.arange(n, dtype=torch.int64)
    got, paths = _run(device, logits, inv, k, p, lmp, seeds, pos)
    assert torch.equal(got, _reference(logits, inv, k, p, lmp, seeds, pos))
    free = gumbel_sample_ref(logits, inv, seeds, pos)
    on_max = logits.gather(1, free[:, None])[:, 0] == logits.max(dim=1).values
    assert bool((paths[:5] == torch.where(on_max[:5], 1, 2)).all()), paths  # off the max: never kept without Z_B


def test_min_p_alone_redraws_under_its_threshold(device):
    g = torch.Generator().manual_seed(4)
    n, vocab = 24, 100
    logits = torch.randn(n, vocab, generator=g) * 0.7  # flat: many draws fall under min-p
    inv = torch.ones(n)
    k = torch.full((n,), -1, dtype=torch.int32)
    p = torch.ones(n)
    lmp = torch.full((n,), 0.6).log()
    seeds = torch.full((n,), 5, dtype=torch.int64)
    pos = torch.arange(n, dtype=torch.int64)
    got, paths = _run(device, logits, inv, k, p, lmp, seeds, pos)
    assert torch.equal(got, _reference(logits, inv, k, p, lmp, seeds, pos))
    assert {1, 2} <= set(paths.tolist())


def test_no_cut_rows_are_plain_draws(device):
    """top_k >= finite tokens, top_p 1 and min_p 0 are no cut: the unrestricted draw."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 90, generator=g)
    logits[1, 5:] = NEG_INF
    logits[3] = NEG_INF  # nothing finite: token 0
    inv = torch.tensor([1.0, 2.0, 0.0, 1.0])
    k = torch.tensor([-1, 5, 3, 2], dtype=torch.int32)
    p, lmp = torch.ones(4), torch.full((4,), NEG_INF)
    seeds, pos = torch.arange(4, dtype=torch.int64), torch.arange(4, dtype=torch.int64)
    got, paths = _run(device, logits, inv, k, p, lmp, seeds, pos)
    assert torch.equal(got, gumbel_sample_ref(logits, inv, seeds, pos))
    assert paths.tolist() == [0, 0, 0, 0] and int(got[3]) == 0 and int(got[1]) < 5


def test_draws_just_outside_the_top_k(device):
    """k + 1 close leaders far above the rest: about one draw in k + 1 lands on the
    (k + 1)-th, which has exactly k tokens above it (count{x > x_t} = k: cut)."""
    n, vocab, k = 48, 130, 3
    logits = torch.full((n, vocab), -6.0)
    logits[:, [9, 70, 33, 100]] = torch.tensor([5.3, 5.2, 5.1, 5.0])
    inv = torch.ones(n)
    kk = torch.full((n,), k, dtype=torch.int32)
    p = torch.tensor([1.0, 0.95, 1.0, 0.8] * 12)  # top-k alone and with top-p
    lmp = torch.where(torch.arange(n) % 4 == 2, torch.tensor(0.001).log(), NEG_INF)
    seeds = torch.full((n,), 3, dtype=torch.int64)
    pos = torch.arange(n, dtype=torch.int64)
    free = gumbel_sample_ref(logits, inv, seeds, pos)
    assert int((free == 100).sum()) >= 4, "some draws should fall on the (k + 1)-th token"
    got, paths = _run(device, logits, inv, kk, p, lmp, seeds, pos)
    want = _reference(logits, inv, kk, p, lmp, seeds, pos)
    assert torch.equal(got, want) and not bool((want == 100).any())
    # the leaders sit in four lanes: L = v_k, so every draw inside the cut is kept at once
    inside = logits.gather(1, free[:, None])[:, 0] >= top_k_top_p_threshold_ref(logits, inv, kk, p, lmp)
    assert torch.equal(paths, torch.where(inside, 1, 2).int()), paths


def test_lower_bound_one_short_of_the_kth(device):
    """Lane 0 holds three of the top four (columns 0, 64, 128), so the lanes' top-two
    lists give L = the 5th largest: count{x > L} = k exactly, L != v_k, and Z_B must not
    be taken as mass{x >= L} (that would keep draws the top-p cut removes)."""
    n, vocab = 24, 130
    logits = torch.full((n, vocab), -4.0)
    logits[:, [0, 64, 128, 5, 6, 7]] = torch.tensor([2.0, 1.8, 1.6, 1.5, 1.4, 1.3])
    inv = torch.ones(n)
    k = torch.full((n,), 4, dtype=torch.int32)
    p = torch.tensor([0.5, 0.6, 0.7, 0.75, 0.8, 0.85] * 4)
    lmp = torch.full((n,), NEG_INF)
    seeds = torch.full((n,), 11, dtype=torch.int64)
    pos = torch.arange(n, dtype=torch.int64)
    got, paths = _run(device, logits, inv, k, p, lmp, seeds, pos)
    assert torch.equal(got, _reference(logits, inv, k, p, lmp, seeds, pos))
    # Z_B is unknown after read 2: every draw off the maximum is settled from the candidates
    free = gumbel_sample_ref(logits, inv, seeds, pos)
    assert torch.equal(paths, torch.where(free == 0, 1, 2).int()), paths
    assert 2 in paths.tolist()


def test_draws_exactly_at_the_min_p_threshold(device):
    """Tokens whose x equals max + log(min_p) to the bit are kept, and a draw on one of
    them is kept at once (path 1), with min-p alone and with top-p."""
    n, vocab = 24, 70
    lmp = torch.full((n,), 0.5).log()  # float32 log(0.5)
    logits = torch.full((n, vocab), -5.0)
    logits[:, 0] = 0.0
    logits[:, [3, 40, 66]] = lmp[0]  # max + log(min_p): on the threshold
    logits[:, [7, 50]] = torch.nextafter(lmp[0], torch.tensor(-1.0))  # just under it
    inv = torch.ones(n)
    k = torch.full((n,), -1, dtype=torch.int32)
    p = torch.tensor([1.0, 0.97] * 12)
    seeds = torch.full((n,), 9, dtype=torch.int64)
    pos = torch.arange(n, dtype=torch.int64)
    thr = top_k_top_p_threshold_ref(logits, inv, k, p, lmp)
    assert bool((thr == lmp).all())
    free = gumbel_sample_ref(logits, inv, seeds, pos)
    on_thr = (free == 3) | (free == 40) | (free == 66)
    assert int(on_thr.sum()) >= 3
    got, paths = _run(device, logits, inv, k, p, lmp, seeds, pos)
    assert torch.equal(got, _reference(logits, inv, k, p, lmp, seeds, pos))
    inside = logits.gather(1, free[:, None])[:, 0] >= thr
    assert torch.equal(paths, torch.where(inside, 1, 2).int()), paths


def test_draw_next_to_the_maximum_is_still_cut(device):
    """Only a draw *on* the maximum is kept without read 2; one a hair below it is cut by
    top-k 1 or top-p 0.3 (the maximum alone holds ~half the mass)."""
    n, vocab = 16, 70
    logits = torch.full((n, vocab), -5.0)
    logits[:, 10] = 3.0
    logits[:, 20] = 2.99
    inv = torch.ones(n)
    k = torch.tensor([1, -1] * 8, dtype=torch.int32)
    p = torch.tensor([1.0, 0.3] * 8)
    lmp = torch.full((n,), NEG_INF)
    seeds = torch.full((n,), 21, dtype=torch.int64)
    pos = torch.arange(n, dtype=torch.int64)
    free = gumbel_sample_ref(logits, inv, seeds, pos)
    assert 10 in free.tolist() and 20 in free.tolist()
    got, paths = _run(device, logits, inv, k, p, lmp, seeds, pos)
    assert torch.equal(got, _reference(logits, inv, k, p, lmp, seeds, pos)) and bool((got == 10).all())
    assert torch.equal(paths, torch.where(free == 10, 1, 2).int()), paths


@pytest.mark.parametrize("cap", [64, 4])
def test_top_p_alone_reads_only_tiles_above_the_draw(device, cap):
    """Top-p without top-k or min-p takes its own route: Z and the tile maxima come with
    the draw, and the second read visits only tiles whose max is above the drawn value.
    Long rows (47 tiles of 64), peaked rows (the nucleus sits in a few tiles), flat rows
    (every tile is visited; with cap 4 the candidates overflow and the pivot search
    runs), a row with its top tokens in the last tile, -inf stretches, tied maxima."""
    g = torch.Generator().manual_seed(7)
    n, vocab = 24, 3000
    scale = torch.tensor([0.3, 1.0, 3.0, 6.0, 12.0, 25.0]).repeat(n // 6)[:, None]
    logits = torch.randn(n, vocab, generator=g) * scale
    logits[1::6, -5:] += 40.0  # the top tokens in the last tile
    logits[2::6, :2500] = NEG_INF
    logits[3::6, [10, 1500, 2990]] = 200.0  # tied maxima in three tiles
    logits[4::6] = logits[4::6].round()  # ties everywhere
    inv = 1 / (torch.rand(n, generator=g) * 1.5 + 0.3)
    k = torch.full((n,), -1, dtype=torch.int32)
    p = torch.rand(n, generator=g) * 0.9 + 0.05
    # one token holds ~4% of the mass, the nucleus at p = 0.03: draws land far outside
    # it (C = {x > x_t} holds ~40% of the row)
    logits[5::6] = torch.randn(n // 6, vocab, generator=g) * 0.5
    logits[5::6, 1234] = 5.0
    inv[5::6], p[5::6] = 1.0, 0.03
    lmp = torch.full((n,), NEG_INF)
    seeds = torch.randint(0, 2**40, (n,), generator=g)
    pos = torch.randint(0, 1000, (n,), generator=g)
    args = (logits, inv, k, p, lmp, seeds, pos)
    got, paths = _run(device, *args, cap=cap)
    want = _reference(*args)
    assert torch.equal(got, want), (got != want).nonzero().flatten().tolist()
    expect = {1, 2} if cap == 64 else {1, 2, 3}
    assert expect <= set(paths.tolist()), paths
    # the rows with one heavy token: every draw outside the cut is redrawn from stored
    # candidates although C = {x > x_t} (x_t: the unrestricted draw) is far over the
    # capacity: only tokens at or above the tile-maxima floor are visited and stored
    x = logits * inv[:, None]
    x_t = x.gather(1, gumbel_sample_ref(logits, inv, seeds, pos)[:, None])[:, 0]
    c_size = (x > x_t[:, None]).sum(1)
    far = (x_t < 5.0) & (torch.arange(n) % 6 == 5)
    assert bool(far.any()) and bool((paths[far] == 2).all()) and bool((c_size[far] > 64).all())


def test_top_p_on_peaked_rows_never_needs_the_pivot_search(device):
    """The benchmark's kind of row (N(0, 1) * 4 / 0.7 over a long vocabulary, top-p 0.9,
    plus a cluster of top tokens spread over three tiles): every draw is settled by the
    draw itself or from stored candidates (paths 1-2, no pivot search) with a candidate
    capacity of 16, far below the number of tokens above a typical rejected draw."""
    g = torch.Generator().manual_seed(11)
    n, vocab = 32, 16384
    logits = torch.randn(n, vocab, generator=g) * 4.0
    # 12 top tokens, 4 in each of three tiles: the tile maxima see 3 of them, the lanes all
    top = torch.tensor([100, 101, 102, 103, 400, 401, 402, 403, 700, 701, 702, 703])
    logits[:, top] = 4.0 * (4.4 + 0.1 * torch.randn(n, 12, generator=g))
    inv = torch.full((n,), 1 / 0.7)
    k = torch.full((n,), -1, dtype=torch.int32)
    p = torch.full((n,), 0.9)
    lmp = torch.full((n,), NEG_INF)
    seeds = torch.arange(n)
    pos = torch.full((n,), 100)
    args = (logits, inv, k, p, lmp, seeds, pos)
    paths = torch.empty(n, dtype=torch.int32, device=device)
    got = sample_with_cuts_triton(*(t.to(device) for t in (logits, inv, seeds, pos, k, p, lmp)), block=256, cap=16,
                                  paths=paths)
    assert torch.equal(got.cpu(), _reference(*args))
    assert set(paths.tolist()) <= {1, 2} and 2 in paths.tolist(), paths


@pytest.mark.parametrize("split, cap, first", [(3, 64, False), (5, 4, False), (3, 64, True), (5, 4, True)])
def test_rows_split_over_programs_sample_the_reference_tokens(device, split, cap, first):
    """split > 1 (five launches, each row over several programs): every kind of row of
    the mixed set (greedy, each cut alone and combined, ties, -inf tails; rows with top-k
    or min-p go through the one-program path in the last launch) and long top-p-only
    rows, including candidate overflow (cap 4: pivot search); also nucleus first
    (top-p-alone rows drawn among their candidates >= F only: path 7, or 3 past the
    capacity)."""
    args = _mixed_rows(2)
    got, paths = _run(device, *args, cap=cap, split=split, nucleus_first=first)
    assert torch.equal(got, _reference(*args)), (got != _reference(*args)).nonzero().flatten().tolist()
    assert ({0, 1, 7} if first else {0, 1, 2}) <= set(paths.tolist()), paths
    assert (7 in paths.tolist()) == first, paths
    g = torch.Generator().manual_seed(8)
    n, vocab = 12, 2000
    logits = torch.randn(n, vocab, generator=g) * torch.tensor([0.3, 1.0, 3.0, 6.0, 12.0, 25.0]).repeat(2)[:, None]
    logits[1, -5:] += 40.0
    logits[2, :1500] = NEG_INF
    logits[5] = torch.randn(vocab, generator=g) * 0.5
    logits[5, 1234] = 5.0
    inv = 1 / (torch.rand(n, generator=g) * 1.5 + 0.3)
    inv[5] = 1.0
    k = torch.full((n,), -1, dtype=torch.int32)
    p = torch.rand(n, generator=g) * 0.9 + 0.05
    p[5] = 0.03
    lmp = torch.full((n,), NEG_INF)
    seeds, pos = torch.randint(0, 2**40, (n,), generator=g), torch.randint(0, 1000, (n,), generator=g)
    args = (logits, inv, k, p, lmp, seeds, pos)
    got, paths = _run(device, *args, cap=cap, split=split, nucleus_first=first)
    assert torch.equal(got, _reference(*args)), (got != _reference(*args)).nonzero().flatten().tolist()
    kinds = set(paths.tolist())
    if first:  # every row is top-p alone: none draws first; the flat rows overflow a capacity of 4
        assert 7 in kinds and kinds <= {3, 4, 7} and (cap == 64 or kinds & {3, 4}), paths
    else:
        assert {1, 2} <= kinds and (cap == 64 or kinds & {3, 4}) and max(kinds) <= 4, paths


def test_nucleus_first_without_a_lane_floor(device):
    """Nucleus first, lanes whose maxima hold less than p Z (three heavy tokens share lane
    5; 64-column tiles): no floor F, so the candidates are the tokens above the smallest
    lane max, and the finish checks their mass reaches p Z before drawing among them
    (path 7); a flat row whose candidates overflow the capacity takes the histogram rounds (4)."""
    n, vocab = 6, 300
    logits = torch.full((n, vocab), NEG_INF)
    logits[:, :64] = 0.0
    logits[:, [5, 69, 133]] = 10.0
    logits[3:] = torch.randn(3, vocab, generator=torch.Generator().manual_seed(3)) * 0.2  # flat
    inv = torch.ones(n)
    k = torch.full((n,), -1, dtype=torch.int32)
    p = torch.full((n,), 0.9)
    lmp = torch.full((n,), NEG_INF)
    seeds, pos = torch.arange(n) * 7919, torch.arange(n) + 3
    args = (logits, inv, k, p, lmp, seeds, pos)
    got, paths = _run(device, *args, cap=16, split=2, nucleus_first=True)
    want = _reference(*args)
    assert torch.equal(got, want), (got, want)
    assert set(got[:3].tolist()) <= {5, 69, 133}
    assert paths.tolist() == [7, 7, 7, 4, 4, 4], paths


def test_split_only_options_are_rejected_without_split():
    x = torch.zeros(2, 10)
    args = (x, torch.ones(2), torch.arange(2), torch.zeros(2, dtype=torch.long),
            torch.full((2,), -1, dtype=torch.int32), torch.full((2,), 0.9), torch.full((2,), NEG_INF))
    with pytest.raises(ValueError, match="nucleus_first=True, lists=0, all_top_p=False need split > 1"):
        sample_with_cuts_triton(*args, nucleus_first=True)
    with pytest.raises(ValueError, match="nucleus_first=False, lists=2, all_top_p=False need split > 1"):
        sample_with_cuts_triton(*args, lists=2)
    with pytest.raises(ValueError, match="marks .* need split > 1"):
        sample_with_cuts_triton(*args, marks=[])


def test_bench_times_every_split_launch(device, monkeypatch):
    """The bench's per-launch breakdown (``marks``: CUDA events between the split sampler's
    launches) names the six launches of nucleus first (two rounds) in order with a time each; on the CPU the events
    are replaced by a counter (one unit per launch)."""
    from core_runner.bench.sampler_bench import _launches
    from core_runner.sample.metadata import SamplingMetadata

    if device == "cpu":
        clock = iter(range(1000))

        class _Event:
            def __init__(self, enable_timing=True):
                pass

            def record(self):
                self.t = next(clock)

            def elapsed_time(self, other):
                return float(other.t - self.t)

        monkeypatch.setattr(torch.cuda, "Event", _Event)
    n = 3
    d = lambda t: t.to(device)  # noqa: E731
    m = SamplingMetadata(inv_temp=d(torch.ones(n)), seeds=d(torch.arange(n)), positions=d(torch.zeros(n).long()),
                         any_random=True)
    m.top_k, m.top_p = d(torch.full((n,), -1, dtype=torch.int32)), d(torch.full((n,), 0.9))
    m.log_min_p = d(torch.full((n,), NEG_INF))
    got = _launches(d(torch.randn(n, 300)), m, 2, split=2, block=64, num_warps=1, nucleus_first=True)
    assert list(got) == ["read1", "read1_draw", "decide", "read2", "round1", "round2"], got
    assert all(v >= 0 for v in got.values()) and sum(got.values()) > 0, got  # (a launch can take < 1 us)
    assert _launches(d(torch.randn(n, 300)), m, 2, split=1, block=64) is None


def _long_top_p_rows(seed, n=12, vocab=2000):
    """Top-p-alone rows from peaked to flat (the flat ones have nuclei of hundreds of
    tokens), tied values across lanes, a -inf tail."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g) * torch.tensor([0.3, 1.0, 3.0, 6.0, 12.0, 25.0]).repeat(2)[:, None]
    logits[3] = logits[3].round()  # ties, also at the lists' bounds
    logits[4, :1500] = NEG_INF
    logits[7, [10, 74, 138, 202, 266]] = 40.0  # five tied maxima in one lane
    inv = 1 / (torch.rand(n, generator=g) * 1.5 + 0.3)
    k = torch.full((n,), -1, dtype=torch.int32)
    p = torch.rand(n, generator=g) * 0.9 + 0.05
    lmp = torch.full((n,), NEG_INF)
    seeds, pos = torch.randint(0, 2**40, (n,), generator=g), torch.randint(0, 1000, (n,), generator=g)
    return logits, inv, k, p, lmp, seeds, pos


@pytest.mark.parametrize("depth, slots, tile_max", [(2, 16, True), (3, 64, True), (3, 64, False), (3, 4, True)])
def test_lane_lists_settle_the_nucleus_in_the_decide(device, depth, slots, tile_max):
    """Nucleus first with lane lists (``lane_lists_triton``): rows whose lists hold the
    nucleus are drawn in the decide launch (path 8); the others (flat rows, five tied
    maxima in one lane, lists past their slots: 4 slots overflow on every row) go on to
    the lane floor and read 2 (7, or 3 past the capacity; without tile maxima read 2
    visits every tile). Every token is the reference's, also on the mixed set (other
    cuts, greedy rows, ties, -inf tails)."""
    long_rows = _long_top_p_rows(8)
    kw = dict(cap=128, split=3, nucleus_first=True, lists=depth, list_slots=slots, tile_max=tile_max)
    for args in (long_rows, _mixed_rows(2)):
        got, paths = _run(device, *args, **kw)
        want = _reference(*args)
        assert torch.equal(got, want), (got != want).nonzero().flatten().tolist()
    paths = _run(device, *long_rows, **kw)[1].tolist()
    assert {paths[0], paths[7]} <= {3, 4} and set(paths) <= {3, 4, 7, 8}, paths  # flattest row; the tied lane
    assert (8 in paths) == (slots > 4), paths


def test_lane_lists_options_are_checked():
    x = torch.zeros(2, 100)
    args = (x, torch.ones(2), torch.arange(2), torch.zeros(2, dtype=torch.long),
            torch.full((2,), -1, dtype=torch.int32), torch.full((2,), 0.9), torch.full((2,), NEG_INF))
    with pytest.raises(ValueError, match="lists=4: the lane depth is 2 or 3"):
        sample_with_cuts_triton(*args, split=2, block=16, nucleus_first=True, lists=4)
    with pytest.raises(ValueError, match="lists=2 needs nucleus_first=True"):
        sample_with_cuts_triton(*args, split=2, block=16, lists=2)
    with pytest.raises(ValueError, match="list_slots=24 must be a power of 2"):
        sample_with_cuts_triton(*args, split=2, block=16, nucleus_first=True, lists=2, list_slots=24)


def test_all_top_p_leaves_out_the_other_rows_draw(device, monkeypatch):
    """``all_top_p`` (every row promised top-p alone): one read-1 launch, the reference's
    tokens (the same with the decide in a launch of its own, ``decide_warps``, with the
    lists' draw on all their slots, ``narrow_draw``, with the entries above T moved
    first, ``decide_width``: a row with more of them than its slots goes on to read 2, and
    with read 1 three tiles ahead and programmatic dependent launches); a row
    that breaks the promise (greedy, no cut, top-k) gets token -1 and path 9 and the others
    keep their tokens."""
    args = list(_long_top_p_rows(8))
    kw = dict(cap=128, split=3, nucleus_first=True, lists=3, list_slots=64, all_top_p=True)
    got, paths = _run(device, *args, **kw)
    assert torch.equal(got, _reference(*args)) and set(paths.tolist()) <= {3, 4, 7, 8}, paths
    got2, paths2 = _run(device, *args, **kw, decide_warps=4)  # the decide in a launch of its own
    assert torch.equal(got2, got) and torch.equal(paths2, paths)
    got3, paths3 = _run(device, *args, **kw, narrow_draw=False)  # the lists' draw on all their slots
    assert torch.equal(got3, got) and torch.equal(paths3, paths)
    got4, paths4 = _run(device, *args, **kw, decide_width=256)  # entries > T moved first; all fit
    assert torch.equal(got4, got) and torch.equal(paths4, paths)
    got5, paths5 = _run(device, *args, **kw, decide_width=8)  # rows with more than 8 go on to read 2
    assert torch.equal(got5, got) and (paths5 == 7).sum() > (paths == 7).sum(), (paths5, paths)
    monkeypatch.setattr(cs, "READ1_AHEAD", 3)  # read 1's loop with three tiles in flight
    monkeypatch.setattr(cs, "PDL_LAUNCH", True)  # programmatic dependent launches (on CUDA sm90+; else none)
    assert all(map(torch.equal, _run(device, *args, **kw), (got, paths)))
    monkeypatch.undo()
    with pytest.raises(ValueError, match="decide_width=24: 0 .all the list slots. or a power of 2"):
        _run(device, *args, **kw, decide_width=24)
    with pytest.raises(ValueError, match="decide_warps=3: 0 .fused into read 1. or a power of 2 up to 16"):
        _run(device, *args, **kw, decide_warps=3)
    logits, inv, k, p, lmp, seeds, pos = (t.clone() for t in args)
    inv[2], p[5], k[9] = 0.0, 1.0, 5
    got, paths = _run(device, logits, inv, k, p, lmp, seeds, pos, **kw)
    broken = [2, 5, 9]
    assert got[broken].tolist() == [-1, -1, -1] and paths[broken].tolist() == [9, 9, 9], (got, paths)
    keep = [i for i in range(len(got)) if i not in broken]
    assert torch.equal(got[keep], _reference(*args)[keep])
    with pytest.raises(ValueError, match="all_top_p=True needs nucleus_first=True"):
        _run(device, *args, cap=128, split=3, all_top_p=True)


def test_split_workspace_is_reused_and_put_back(device, monkeypatch):
    """The split kernels' scratch lives between calls (``split_workspace``): calls of other
    batch sizes and options on one workspace sample the reference's tokens, and after each
    call the candidate counters, tickets and the work list are back at 0 for the next one.
    Read 2's chunks are 256 columns here, so a row is several work items (its finish runs
    on the last one to take the row's ticket; a row with other cuts on its first)."""
    from core_runner.kernels import split_workspace as sw

    monkeypatch.setattr(sw, "CHUNK_COLS", 256)
    args = _long_top_p_rows(8)
    fused = dict(cap=128, split=3, nucleus_first=True, lists=3, list_slots=64, all_top_p=True)
    calls = [(args, fused), (tuple(t[:5] for t in args), fused), (args, dict(fused, all_top_p=False)),
             (_mixed_rows(2, n=20, vocab=600), dict(fused, all_top_p=False))]
    for call_args, kw in calls:
        got, paths = _run(device, *call_args, **kw)
        assert torch.equal(got, _reference(*call_args)), kw
        n_tiles = -(-call_args[0].shape[1] // 64)
        (ws,) = [w for w in sw._CACHE.values()
                 if w.lx.shape[-1] == 64 and w.cand_x.shape[-1] == 128 and w.tmax.shape[1] == n_tiles
                 and w.a_chunks.shape[1] == -(-n_tiles // 4)]  # chunks of 4 tiles
        assert int(ws.n_c.abs().sum()) == 0 and int(ws.ticket.abs().sum()) == 0
        assert not ws.work[:, :2].any()  # every work list's length and count
    assert {1, 2, 3, 7} <= set(paths.tolist()), paths  # the mixed rows: one-program cuts, read 2, pivot search
