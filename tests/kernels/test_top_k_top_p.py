"""Triton sampling kernels against their torch references (interpreter on the CPU):
top-k / top-p / min-p thresholds, Gumbel-Max under a threshold, logsumexp + rank, and
the whole pipeline on the Triton path against the torch path."""
from __future__ import annotations

import pytest
import torch

from core_runner.sample.gumbel import Draw, gumbel_sample_ref
from core_runner.sample.gumbel_triton import gumbel_sample_triton
from core_runner.sample.logit_bias import apply_logit_edits
from core_runner.sample.logprobs import logsumexp_rank_ref
from core_runner.sample.logprobs_triton import logsumexp_rank_triton
from core_runner.sample.penalties import PenaltyInputs, apply_penalties
from core_runner.sample.sampler import StepInputs, sample_inputs
from core_runner.sample.top_k_top_p import Cuts, top_k_top_p_threshold_ref
from core_runner.sample.top_k_top_p_triton import top_k_top_p_threshold_triton

NEG_INF = float("-inf")


def _rows(vocab=300, seed=0):
    """Ten rows covering every cut alone and combined, greedy, -inf tokens and ties."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(10, vocab, generator=g) * 3
    logits[1, 50:] = NEG_INF  # few finite tokens: top_k=100 > 50 finite means no top-k cut
    logits[2] = torch.randint(0, 6, (vocab,), generator=g).float()  # heavy ties
    logits[7, :5] = 40.0  # five tied maxima
    inv = torch.tensor([1.0, 2.0, 0.5, 1.0, 0.0, 1.3, 1.0, 1.0, 1.0, 0.7])
    k = torch.tensor([5, 100, 3, -1, 5, 20, -1, 2, 1, 7], dtype=torch.int32)
    p = torch.tensor([1.0, 0.9, 0.5, 0.8, 0.5, 0.95, 1.0, 0.3, 1.0, 0.99])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.1, 0.05, 0.2, 0.0, 0.0, 0.3])
    return logits, inv, k, p, min_p.log()


def _top_p_margin(logits, inv, k, p, lmp):
    """Smallest |cumulative mass - p| at the end of a run of equal values (rows with a top-p
    cut): a float-rounding tie there could legitimately flip a threshold."""
    thr_no_p = top_k_top_p_threshold_ref(logits, inv, k, torch.ones_like(p), lmp)
    margins = []
    for i in range(logits.shape[0]):
        if inv[i] == 0 or p[i] >= 1:
            continue
        x = (logits[i] * inv[i]).double()
        x = x[x >= thr_no_p[i].double()].sort(descending=True).values
        e = torch.exp(x - x[0])
        cum = e.cumsum(0) / e.sum()
        group_end = torch.ones_like(x, dtype=torch.bool)  # the cut can only move between values
        group_end[:-1] = x[1:] != x[:-1]
        margins.append(float((cum[group_end] - p[i]).abs().min()))
    return min(margins)


def test_threshold_kernel_equals_reference(device):
    logits, inv, k, p, lmp = _rows()
    assert _top_p_margin(logits, inv, k, p, lmp) > 1e-4, "test rows put a top-p cut on a rounding tie"
    ref = top_k_top_p_threshold_ref(logits, inv, k, p, lmp)
    args = [t.to(device) for t in (logits, inv, k, p, lmp)]
    got = top_k_top_p_threshold_triton(*args, block=64).cpu()  # 300 is not a multiple of 64
    assert torch.equal(got, ref), (got, ref)
    x = logits * inv[:, None]
    kept = (x >= ref[:, None]).sum(dim=1)
    assert ref[4] == NEG_INF and ref[6] != NEG_INF  # greedy row: no cut; min_p alone cuts
    assert kept[0] == 5 and kept[8] == 1  # plain top-k
    assert kept[7] == 5  # top_k=2 among five tied maxima keeps all five
    assert kept[2] >= 3 and (x[2] == ref[2]).sum() > 1  # a tie at the top-k threshold stays in
    assert kept[1] <= 50  # only finite tokens count


@pytest.mark.parametrize("cap", [4, 32])
def test_threshold_search_ends_on_the_sorted_bracket(device, cap):
    """With a small candidate capacity the search stops once its bracket holds <= cap
    tokens and reads the answer off their sorted values (plus the count / mass above the
    bracket); ties, -inf tails, one-key brackets and both cuts are all in these rows."""
    g = torch.Generator().manual_seed(7)
    n, vocab = 20, 300
    logits = torch.randn(n, vocab, generator=g) * (torch.rand(n, 1, generator=g) * 3 + 0.2)
    logits[::4] = logits[::4].round(decimals=1)
    logits[2::6, 150:] = NEG_INF
    logits[5, :40] = 3.0  # 40 tokens of one value at the top
    inv = 1 / (torch.rand(n, generator=g) + 0.3)
    inv[::7] = 0.0
    k = torch.randint(1, 200, (n,), generator=g, dtype=torch.int32)
    k[1::3] = -1
    k[5] = 10
    p = torch.rand(n, generator=g) * 0.95 + 0.03
    p[::5] = 1.0
    lmp = (torch.rand(n, generator=g) * 0.2).log()
    lmp[::2] = NEG_INF
    assert _top_p_margin(logits, inv, k, p, lmp) > 1e-5, "test rows put a top-p cut on a rounding tie"
    ref = top_k_top_p_threshold_ref(logits, inv, k, p, lmp)
    got = top_k_top_p_threshold_triton(*(t.to(device) for t in (logits, inv, k, p, lmp)), block=64, cap=cap)
    assert torch.equal(got.cpu(), ref), (got.cpu() != ref).nonzero().flatten().tolist()


def test_gumbel_kernel_respects_threshold(device):
    logits, inv, k, p, lmp = _rows(vocab=200, seed=1)
    thr = top_k_top_p_threshold_ref(logits, inv, k, p, lmp)
    seeds = torch.arange(10, dtype=torch.int64) * 7919 + 1
    pos = torch.arange(10, dtype=torch.int64) + 33
    want = gumbel_sample_ref(logits, inv, seeds, pos, thr)
    got = gumbel_sample_triton(*(t.to(device) for t in (logits, inv, seeds, pos, thr)), block=64).cpu()
    assert torch.equal(got, want)
    x = logits * inv[:, None]
    assert bool((x.gather(1, got[:, None])[:, 0] >= thr).all())
    assert int(got[4]) == int(logits[4].argmax())


def test_logsumexp_rank_kernel(device):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 300, generator=g) * 5
    logits[1, ::3] = NEG_INF
    logits[3, :4] = 30.0  # tied best tokens share rank 1
    tok = torch.tensor([7, 1, 299, 2, 150])
    lse_r, tl_r, rank_r = logsumexp_rank_ref(logits, tok)
    lse, tlg, rank = (t.cpu() for t in logsumexp_rank_triton(logits.to(device), tok.to(device), block=128))
    assert torch.allclose(lse, lse_r, atol=1e-5, rtol=0) and torch.equal(tlg, tl_r) and torch.equal(rank, rank_r)
    assert torch.allclose(lse_r, torch.logsumexp(logits, dim=-1))
    assert rank_r[3] == 1 and rank_r[2] == 1 + (logits[2] > logits[2, 299]).sum()


def test_triton_pipeline_equals_torch_pipeline(device):
    """Every stage at once (bias, penalties, temperature, cuts, Gumbel, logprobs)."""
    logits, inv, k, p, lmp = _rows(vocab=160, seed=3)
    n, vocab = logits.shape
    g = torch.Generator().manual_seed(4)
    table = torch.randint(0, vocab, (4, 12), generator=g, dtype=torch.int32)

    def meta(dev):
        d = lambda t: t.to(dev)  # noqa: E731
        edits = (d(torch.tensor([3, vocab + 5, 2 * vocab + 7])), d(torch.tensor([2.0, NEG_INF, -1.5])))
        penalties = PenaltyInputs(
            batch_idx=d(torch.tensor([0, 2, 5, 9])), token_ids=d(table), seq_lens=d(torch.tensor([12, 7, 9, 10])),
            num_prompt=d(torch.tensor([4, 7, 2, 6])), repetition=d(torch.tensor([1.3, 1.0, 0.7, 1.1])),
            frequency=d(torch.tensor([0.4, 0.0, -0.3, 1.0])), presence=d(torch.tensor([0.2, 0.5, 0.0, -0.4])),
        )
        return StepInputs(
            Draw(d(inv), d(torch.arange(n, dtype=torch.int64) + 5), d(torch.full((n,), 9))), Cuts(d(k), d(p), d(lmp)),
            edits=[(lambda x, e: apply_logit_edits(x, *e), edits), (apply_penalties, penalties)],
            logprob_rows=[(0, 3), (5, 0), (9, 4)],
        )

    want = sample_inputs(logits, meta("cpu"), use_triton=False)
    got = sample_inputs(logits.to(device), meta(device), use_triton=True)
    assert torch.equal(got.sampled.cpu(), want.sampled)
    assert torch.equal(got.logprobs.top_ids.cpu(), want.logprobs.top_ids)
    assert torch.equal(got.logprobs.ranks.cpu(), want.logprobs.ranks)
    assert torch.allclose(got.logprobs.token_logprobs.cpu(), want.logprobs.token_logprobs, atol=1e-5)
