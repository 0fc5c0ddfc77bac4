"""The sampling pipeline on the CPU (torch path), stage by stage, against straightforward
implementations written here: goodness of fit of the Gumbel draws, the cut definitions,
penalties, logit bias, logprobs and parameter validation."""
from __future__ import annotations

import math

import pytest
import torch

from core_runner import SamplingParams
from core_runner.sample.gumbel import Draw, inverse_temperature
from core_runner.sample.logit_bias import apply_logit_edits, pack_edits, row_edits
from core_runner.sample.logprobs import compute_logprobs
from core_runner.sample.penalties import PenaltyInputs, apply_penalties
from core_runner.sample.sampler import StepInputs, sample_inputs
from core_runner.sample.top_k_top_p import Cuts, apply_top_k_top_p_ref, top_k_top_p_threshold_ref

NEG_INF = float("-inf")
Z_999 = 3.0902  # standard normal quantile at 0.999


def chi2_critical(df: int, z: float = Z_999) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (good to ~1% for df >= 2)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def kept_by_definition(x: list[float], top_k: int, top_p: float, min_p: float) -> set[int]:
    """The tokens a cut keeps, written out literally (sorted list, python floats)."""
    order = sorted(range(len(x)), key=lambda i: -x[i])
    finite = [i for i in order if x[i] > NEG_INF]
    keep = list(finite)
    if min_p > 0:
        keep = [i for i in keep if x[i] >= x[finite[0]] + math.log(min_p)]
    if 0 < top_k < len(keep):
        keep = [i for i in keep if x[i] >= x[keep[top_k - 1]]]  # ties with the k-th stay
    if top_p < 1:
        z = sum(math.exp(x[i] - x[finite[0]]) for i in keep)
        mass, cut = 0.0, None
        for i in keep:
            mass += math.exp(x[i] - x[finite[0]]) / z
            if mass >= top_p:
                cut = x[i]
                break
        keep = [i for i in keep if x[i] >= cut]
    return set(keep)


def _meta(n, temperature, top_k=-1, top_p=1.0, min_p=0.0, seed=7, positions=None):
    inv = inverse_temperature(torch.full((n,), float(temperature)))
    draw = Draw(inv_temp=inv, seeds=torch.full((n,), seed, dtype=torch.int64),
                positions=torch.arange(n) if positions is None else positions)
    m = StepInputs(draw if temperature > 0 else None)
    if top_k > 0 or top_p < 1 or min_p > 0:
        m.cuts = Cuts(torch.full((n,), top_k, dtype=torch.int32), torch.full((n,), top_p),
                      torch.full((n,), min_p).log())
    return m


# ---------------------------------------------------------------------------------
# goodness of fit: many draws of one row, one per position key
# ---------------------------------------------------------------------------------
ROW = torch.tensor([2.0, 1.5, 1.2, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, NEG_INF, 0.7])  # 11: not a tile multiple


@pytest.mark.parametrize("temperature, top_k, top_p, min_p", [
    (1.0, -1, 1.0, 0.0), (0.5, -1, 1.0, 0.0), (2.0, -1, 1.0, 0.0),
    (1.0, 4, 1.0, 0.0), (0.8, -1, 0.7, 0.0), (1.0, -1, 1.0, 0.2), (1.3, 6, 0.8, 0.05),
])
def test_gumbel_draws_fit_the_cut_softmax(temperature, top_k, top_p, min_p):
    n = 30000
    logits = ROW.repeat(n, 1)
    out = sample_inputs(logits, _meta(n, temperature, top_k, top_p, min_p)).sampled
    counts = torch.bincount(out, minlength=ROW.numel()).double()
    x = (ROW / temperature).tolist()
    kept = sorted(kept_by_definition(x, top_k, top_p, min_p))
    outside = [i for i in range(ROW.numel()) if i not in kept]
    assert counts[outside].sum() == 0, f"sampled tokens outside the kept set {kept}: {counts.tolist()}"
    probs = torch.softmax(torch.tensor([x[i] for i in kept], dtype=torch.float64), 0)
    expect = probs * n
    chi2 = float(((counts[kept] - expect) ** 2 / expect).sum())
    df = len(kept) - 1
    assert df >= 1, "the setting should leave a real choice"
    assert chi2 < chi2_critical(df), f"chi2={chi2:.1f} >= {chi2_critical(df):.1f} (df={df}); counts {counts[kept]}"


def test_gumbel_draws_are_not_trivially_uniform_or_greedy():
    """The fit test can fail: a uniform sampler and the argmax are both rejected by it."""
    n = 30000
    expect = torch.softmax(ROW[:9].double(), 0) * n
    uniform = torch.randint(0, 9, (n,), generator=torch.Generator().manual_seed(0))
    for fake in (uniform, torch.zeros(n, dtype=torch.long)):
        counts = torch.bincount(fake, minlength=9).double()
        assert float(((counts - expect) ** 2 / expect).sum()) > chi2_critical(8)


def test_minus_inf_logits_never_sampled():
    g = torch.Generator().manual_seed(5)
    n, vocab = 4000, 37
    logits = torch.randn(n, vocab, generator=g) * 4
    banned = torch.rand(n, vocab, generator=g) < 0.7
    banned[:, 0] = False  # at least one finite token per row
    logits[banned] = NEG_INF
    for temperature, top_p in ((1.0, 1.0), (3.0, 1.0), (0.3, 0.9)):
        out = sample_inputs(logits, _meta(n, temperature, top_p=top_p)).sampled
        assert not bool(banned.gather(1, out[:, None]).any())
    greedy = sample_inputs(logits, _meta(n, 0.0)).sampled
    assert torch.equal(greedy, logits.argmax(dim=-1))


def test_no_token_wins_on_an_infinite_draw():
    """Seed 0 at position 7 hashes column 124594 to the top 24-bit value, whose uniform
    rounded to 1.0 in float32 before the clamp: an infinite Gumbel draw that sampled that
    token whatever its logit. Now it is an ordinary (large) draw."""
    vocab = 124600
    logits = torch.zeros(2, vocab)
    logits[:, 124594] = -50.0
    logits[1, 124594] = NEG_INF
    m = _meta(2, 1.0, positions=torch.tensor([7, 7]))
    m.draw.seeds = torch.tensor([0, 0])
    out = sample_inputs(logits, m).sampled
    assert 124594 not in out.tolist()


def test_same_seed_and_position_give_same_token_in_any_row():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(6, 50, generator=g)
    m = _meta(6, 0.9, top_p=0.9, positions=torch.tensor([3, 3, 4, 3, 3, 9]))
    m.draw.seeds = torch.tensor([1, 1, 1, 2, 1, 1])
    row = logits[0].repeat(6, 1)
    out = sample_inputs(row, m).sampled.tolist()
    assert out[0] == out[1] == out[4]  # same (seed, position): same draw in any row
    assert len({out[0], out[2], out[3], out[5]}) > 1  # other keys: other draws


# ---------------------------------------------------------------------------------
# the cut definitions
# ---------------------------------------------------------------------------------
def test_threshold_reference_matches_the_literal_definition():
    g = torch.Generator().manual_seed(8)
    checked = 0
    for trial in range(60):
        vocab = int(torch.randint(5, 40, (1,), generator=g))
        x = (torch.randn(vocab, generator=g) * 2).round(decimals=1 if trial % 2 else 3)  # ties when coarse
        if trial % 5 == 0:
            x[torch.rand(vocab, generator=g) < 0.3] = NEG_INF
        x[0] = max(float(x[0]), -1.0)  # a finite token
        top_k = int(torch.randint(-1, vocab + 2, (1,), generator=g)) or -1
        top_p = float(torch.rand(1, generator=g)) * 0.98 + 0.02 if trial % 3 else 1.0
        min_p = float(torch.rand(1, generator=g)) * 0.5 if trial % 4 == 0 else 0.0
        thr = top_k_top_p_threshold_ref(x[None], torch.ones(1), torch.tensor([top_k]), torch.tensor([top_p]),
                                        torch.tensor([min_p]).log())
        got = set(torch.nonzero(x >= thr[0]).flatten().tolist())
        want = kept_by_definition(x.tolist(), top_k, top_p, min_p)
        assert got == want, (trial, x.tolist(), top_k, top_p, min_p)
        checked += len(want) < (x > NEG_INF).sum()
    assert checked > 20, "most trials should cut something"


def test_apply_top_k_top_p_ref_masks_outside_the_cut():
    x = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0], [0.0, 0.0, 5.0, 0.0, 0.0]])
    masked = apply_top_k_top_p_ref(x, torch.tensor([2, -1]), torch.tensor([1.0, 0.5]))
    assert masked[0].isinf().tolist() == [False, True, False, False, True]  # the tie at rank 2 stays
    assert masked[1].isinf().tolist() == [True, True, False, True, True]


# ---------------------------------------------------------------------------------
# penalties and logit bias against straightforward implementations
# ---------------------------------------------------------------------------------
def penalties_straightforward(logits, rows, toks, seq_lens, num_prompt, rep, freq, pres):
    out = logits.clone()
    vocab = logits.shape[1]
    for j, i in enumerate(rows):
        known = toks[j, : seq_lens[j]].long()
        output = known[num_prompt[j]:]
        seen = torch.zeros(vocab, dtype=torch.bool)
        seen[known] = True
        counts = torch.bincount(output, minlength=vocab).float()
        x = out[i]
        x = torch.where(seen, torch.where(x > 0, x / rep[j], x * rep[j]), x)
        x = x - freq[j] * counts
        x = x - pres[j] * (counts > 0).float()
        out[i] = x
    return out


@pytest.mark.parametrize("stages", ["all", "repetition", "frequency_presence"])
def test_penalties_match_straightforward(stages):
    g = torch.Generator().manual_seed(9)
    n, vocab, length = 7, 53, 20
    logits = torch.randn(n, vocab, generator=g) * 3
    logits[2, 5] = NEG_INF
    rows = [0, 2, 3, 6]
    toks = torch.randint(0, 12, (4, length), generator=g, dtype=torch.int32)  # few ids: many repeats
    toks[:, -3:] = torch.randint(-5, 1000, (4, 3), generator=g, dtype=torch.int32)  # stale garbage past seq_lens
    seq_lens, num_prompt = [17, 9, 12, 3], [5, 9, 1, 2]
    rep = [1.5, 0.8, 1.0, 2.0] if stages != "frequency_presence" else [1.0] * 4
    freq = [0.5, -0.7, 1.2, 0.0] if stages != "repetition" else [0.0] * 4
    pres = [0.3, 0.0, -1.1, 2.0] if stages != "repetition" else [0.0] * 4
    want = penalties_straightforward(logits, rows, toks, seq_lens, num_prompt, rep, freq, pres)
    got = logits.clone()
    t = lambda v, dt=torch.float32: torch.tensor(v, dtype=dt)  # noqa: E731
    apply_penalties(got, PenaltyInputs(
        batch_idx=t(rows, torch.int64), token_ids=toks, seq_lens=t(seq_lens, torch.int64),
        num_prompt=t(num_prompt, torch.int64),
        repetition=t(rep) if stages != "frequency_presence" else None,
        frequency=t(freq) if stages != "repetition" else None, presence=t(pres) if stages != "repetition" else None,
    ))
    assert torch.equal(got, want), (got - want).abs().nan_to_num().max()
    assert not torch.equal(got, logits)
    for i in (1, 4, 5):
        assert torch.equal(got[i], logits[i]), "a row without penalties changed"


def test_logit_bias_and_min_tokens_edits_match_straightforward():
    g = torch.Generator().manual_seed(10)
    n, vocab = 4, 30
    logits = torch.randn(n, vocab, generator=g)
    bias = {3: 5.0, 7: -2.5, 29: 100.0}
    stop = [7, 11, 45]  # 45 is past the logits: dropped
    parts = [(0, row_edits(bias, ())), (2, row_edits(bias, stop)), (3, row_edits(None, stop))]
    assert row_edits(None, ()) is None
    flat, vals = pack_edits(parts, vocab)
    got = logits.clone()
    apply_logit_edits(got, flat, vals)
    want = logits.clone()
    for i in (0, 2):
        for t, b in bias.items():
            want[i, t] += b
    for i in (2, 3):
        want[i, [7, 11]] = NEG_INF
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------------
# logprobs
# ---------------------------------------------------------------------------------
def test_logprobs_equal_log_softmax():
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(9, 70, generator=g) * 4
    logits[3, 10:] = NEG_INF
    tok = torch.tensor([0, 5, 69, 2, 33, 33, 8, 1, 60])
    lp = compute_logprobs(logits, tok, 4)
    ref = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(lp.token_logprobs, ref.gather(1, tok[:, None])[:, 0], atol=1e-5)
    assert torch.equal(lp.top_ids, logits.topk(4, dim=-1).indices)
    assert torch.allclose(lp.top_logprobs, ref.gather(1, lp.top_ids), atol=1e-5)
    assert torch.equal(lp.ranks, (logits > logits.gather(1, tok[:, None])).sum(dim=-1) + 1)
    assert compute_logprobs(logits, tok, 0).top_ids.shape == (9, 0)


# ---------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"min_p": -0.1}, r"min_p=-0.1 is invalid: expected a number in \[0, 1\]"),
    ({"min_p": 1.5}, r"min_p=1.5 is invalid"),
    ({"repetition_penalty": 0.0}, r"repetition_penalty=0.0 is invalid: expected a finite number > 0"),
    ({"repetition_penalty": float("inf")}, r"repetition_penalty=inf is invalid"),
    ({"frequency_penalty": 2.5}, r"frequency_penalty=2.5 is invalid: expected a number in \[-2, 2\]"),
    ({"presence_penalty": -3}, r"presence_penalty=-3 is invalid: expected a number in \[-2, 2\]"),
    ({"temperature": float("nan")}, r"temperature=nan is invalid"),
    ({"top_k": -2}, r"top_k=-2 is invalid"),
    ({"top_p": 1.01}, r"top_p=1.01 is invalid: expected a number in \(0, 1\]"),
    ({"logprobs": -1}, r"logprobs=-1 is invalid: expected None or an integer >= 0"),
    ({"prompt_logprobs": 2.5}, r"prompt_logprobs=2.5 is invalid"),
    ({"logit_bias": {5: 200.0}}, r"logit_bias=.* is invalid: bias 200.0 of token 5 is outside \[-100, 100\]"),
    ({"logit_bias": {-1: 1.0}}, r"logit_bias=.* is invalid: token id -1 is outside \[0, 2\*\*63\)"),
    ({"logit_bias": [1, 2]}, r"logit_bias=\[1, 2\] is invalid"),
    ({"stop": ["ok", ""]}, r"stop=\['ok', ''\] is invalid"),
    ({"min_tokens": 5, "max_tokens": 4}, r"min_tokens=5 is invalid"),
])
def test_bad_sampling_params_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_normalise():
    sp = SamplingParams(stop="END", logit_bias={"12": 1})
    assert sp.stop == ["END"] and sp.logit_bias == {12: 1.0}


# ---------------------------------------------------------------------------------
# the sampler benchmark (GPU numbers come from a GPU session; this is the CPU smoke run)
# ---------------------------------------------------------------------------------
def test_sampler_bench_smoke(tmp_path, single_torch_thread):
    import json

    from core_runner.bench.sampler_bench import format_sampler_result, run_sampler_bench
    from core_runner.cli import main

    res = run_sampler_bench("cpu", batch=4, vocab=1000, iters=1, warmup=0, scales=(2.0,))
    assert res["sampler_top_p_ms"] > 0 and res["logits_read_ms"] > 0 and res["ratio_to_read"] > 0
    flat = res["top_p_by_scale"]["2.0"]
    assert flat["ms"] > 0 and flat["rows_off_reference"] == 0
    assert res["top_p_peak_extra_mib"] is None  # measured on CUDA only
    assert "torch softmax + multinomial" in format_sampler_result(res)
    out = tmp_path / "s.json"
    assert main(["bench", "--sampler", "--device", "cpu", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["sampler"]["vocab"] == 2048
