"""The histogram rounds of the split cut sampler (``split_rounds_triton``): flat rows whose
candidates overflow the capacity find their nucleus over many programs, and sample the
reference's tokens."""
from __future__ import annotations

import pytest
import torch

from core_runner.kernels import split_workspace as sw
from core_runner.kernels.cut_sample_triton import sample_with_cuts_triton
from test_cut_sample import NEG_INF, _reference, _run


def _flat_rows(seed, n=8, vocab=1500):
    """Top-p-alone rows from flat (nuclei of hundreds of tokens) to peaked, one of heavy
    ties (three values: a tied block no bracket can split), one with a -inf tail."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g) * torch.tensor([0.2, 0.5, 1.0, 1.5, 3.0, 8.0, 0.5, 1.0])[:n, None]
    logits[6] = torch.randint(0, 3, (vocab,), generator=g).float()
    logits[7, 900:] = NEG_INF
    inv = 1 / (torch.rand(n, generator=g) * 1.0 + 0.5)
    k = torch.full((n,), -1, dtype=torch.int32)
    p = torch.rand(n, generator=g) * 0.6 + 0.35
    lmp = torch.full((n,), NEG_INF)
    seeds, pos = torch.randint(0, 2**40, (n,), generator=g), torch.randint(0, 1000, (n,), generator=g)
    return logits, inv, k, p, lmp, seeds, pos


@pytest.mark.parametrize("rounds", [0, 1, 2])
def test_flat_rows_take_the_histogram_rounds(device, monkeypatch, rounds):
    """Capacity 16 and read-2 chunks of 256 columns: the flat rows overflow the candidates.
    Without rounds they take the one-program pivot search (path 3); with rounds they are
    drawn after histogram rounds (path 4), except rows still searching in the last round
    (the tied row always: path 3). Every token is the reference's, and the work lists and
    counters are back at 0 after the call."""
    monkeypatch.setattr(sw, "CHUNK_COLS", 256)
    args = _flat_rows(5)
    got, paths = _run(device, *args, cap=16, split=3, nucleus_first=True, lists=3, list_slots=64, all_top_p=True,
                      rounds=rounds)
    want = _reference(*args)
    assert torch.equal(got, want), (got != want).nonzero().flatten().tolist()
    paths = paths.tolist()
    assert paths[6] == 3 and paths[3] == paths[5] == 8, paths  # the tied block; two rows the lane lists hold
    flat = [paths[i] for i in (0, 1, 2, 4, 7)]
    if rounds == 0:
        assert flat == [3] * 5, paths
    else:
        assert 4 in flat and set(flat) <= {3, 4}, paths
    if rounds == 2:
        assert flat == [4] * 5, paths  # a search round where read 2's histogram leaves too many, then the gather
    (ws,) = [w for w in sw._CACHE.values() if w.cand_x.shape[-1] == 16 and w.lx.shape[-1] == 64]
    assert not ws.work[:, :2].any() and not ws.n_c.any() and not ws.ticket.any()


def test_overflow_without_read2_histogram_searches_in_the_first_round(device):
    """A row whose nucleus sits in one lane (twelve close tokens in lane 5, the rest -inf):
    few lane maxima above lo, so the decide does not flag it for read 2's histogram; its
    candidates overflow a capacity of 4 and it searches in the first round instead, then
    is gathered (path 4) or, still searching in the last round, takes the pivot search (3)."""
    n, vocab = 3, 1500
    g = torch.Generator().manual_seed(2)
    logits = torch.full((n, vocab), NEG_INF)
    cols = torch.arange(12) * 64 + 5
    logits[:, cols] = 10.0 + torch.randn(n, 12, generator=g) * 0.3
    logits[:, 7] = 6.0  # one token in another lane
    inv = torch.ones(n)
    k = torch.full((n,), -1, dtype=torch.int32)
    p = torch.tensor([0.9, 0.6, 0.99])
    lmp = torch.full((n,), NEG_INF)
    seeds, pos = torch.tensor([11, 12, 13]), torch.tensor([1, 2, 3])
    args = (logits, inv, k, p, lmp, seeds, pos)
    got, paths = _run(device, *args, cap=4, split=3, nucleus_first=True, lists=3, list_slots=64, all_top_p=True)
    want = _reference(*args)
    assert torch.equal(got, want), (got, want)
    assert set(paths.tolist()) <= {3, 4} and 4 in paths.tolist(), paths
    (ws,) = [w for w in sw._CACHE.values() if w.cand_x.shape[-1] == 4 and w.lx.shape[-1] == 64]
    assert ws.brk[:n, 3].tolist() == [0.0] * n  # not flagged: no histogram in read 2


def test_rounds_is_checked():
    x = torch.zeros(2, 100)
    args = (x, torch.ones(2), torch.arange(2), torch.zeros(2, dtype=torch.long),
            torch.full((2,), -1, dtype=torch.int32), torch.full((2,), 0.9), torch.full((2,), NEG_INF))
    with pytest.raises(ValueError, match="rounds=4: the histogram rounds after read 2 number 0 to 3"):
        sample_with_cuts_triton(*args, split=2, block=16, nucleus_first=True, rounds=4)
