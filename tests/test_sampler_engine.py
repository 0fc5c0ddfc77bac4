"""The sampler through the engine (CPU, float32, tiny random Qwen3): logprobs against the
recorded logits, prompt logprobs against one transformers forward under chunking and
preemption, penalties / bias / min_tokens against a literal reimplementation on the
recorded logits, seeded reproducibility with every stage on, and request-time checks."""
from __future__ import annotations

import pytest
import torch
from helpers import Recorder, drain, hf_greedy, hf_logits, make_engine, random_prompts, run, step_until

from core_runner import LLM, SamplingParams
from core_runner.engine.outputs import Logprob

N_NEW = 8
FULL = dict(temperature=0.9, top_k=40, top_p=0.85, min_p=0.02, repetition_penalty=1.3, frequency_penalty=0.4,
            presence_penalty=0.3, logit_bias={5: 2.0, 17: -3.0}, min_tokens=3, stop_token_ids=[9],
            ignore_eos=True)


def full_params(seed=321, n=N_NEW, **over):
    return SamplingParams(max_tokens=n, seed=seed, **{**FULL, **over})


def _check_entry(entry: dict, token: int, logits: torch.Tensor, k: int, atol: float = 1e-5) -> None:
    ref = torch.log_softmax(logits.double(), dim=-1)
    assert token in entry and len(entry) in (k, k + 1), (token, entry, k)
    assert list(entry)[0] == token, "the chosen token comes first"
    top = set(entry) if len(entry) == k else set(entry) - {token}
    assert top == set(logits.topk(k).indices.tolist())
    for t, lp in entry.items():
        assert isinstance(lp, Logprob)
        assert abs(lp.logprob - float(ref[t])) <= atol, f"token {t}: {lp} vs log_softmax {float(ref[t])}"
        if t != token or len(entry) == k:  # a top-k token: 1 + the tokens with a larger logit
            assert lp.rank == 1 + int((logits > logits[t]).sum()), (t, lp)


# ---------------------------------------------------------------------------------
# logprobs of generated tokens
# ---------------------------------------------------------------------------------
def test_logprobs_equal_log_softmax_of_recorded_logits(untied):
    prompts = random_prompts([9, 14, 4], seed=81)
    e = make_engine(untied, max_num_batched_tokens=10)
    rec = Recorder(e)
    outs = run(e, [
        ("k0", prompts[0], SamplingParams(max_tokens=N_NEW, temperature=0.0, logprobs=0, ignore_eos=True)),
        ("k3", prompts[1], full_params(logprobs=3)),
        ("none", prompts[2], full_params()),
        ("k5", prompts[2], SamplingParams(max_tokens=N_NEW, temperature=1.0, seed=4, logprobs=5, ignore_eos=True)),
    ])
    assert outs["none"].outputs[0].logprobs is None
    ranks = {}
    for rid, k in (("k0", 0), ("k3", 3), ("k5", 5)):
        o = outs[rid].outputs[0]
        logits = rec.sampling_logits(rid, len(outs[rid].prompt_token_ids))
        assert len(o.logprobs) == len(o.token_ids) == len(logits)
        ranks[rid] = [entry[tok].rank for tok, entry in zip(o.token_ids, o.logprobs)]
        for tok, entry, rank, lg in zip(o.token_ids, o.logprobs, ranks[rid], logits):
            _check_entry(entry, tok, lg, k)
            assert rank == 1 + int((lg > lg[tok]).sum())
            # the token's text where the checkpoint has a tokenizer
            assert all((lp.decoded_token is None) == (e.tokenizer is None) for lp in entry.values())
        assert o.cumulative_logprob == pytest.approx(sum(d[t].logprob for d, t in zip(o.logprobs, o.token_ids)))
    # raw logprobs: the sampled tokens of the penalised, cut request are often not rank 1
    assert max(ranks["k3"]) > 1
    assert ranks["k0"] == [1] * N_NEW  # greedy without penalties


def test_logprobs_beyond_max_rejected_at_request_time(untied):
    e = make_engine(untied, max_logprobs=4)
    ok = SamplingParams(max_tokens=2, logprobs=4, prompt_logprobs=4)
    e.add_request([1, 2, 3], ok)
    for field in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=rf"SamplingParams\.{field}=5 is invalid: expected at most max_logprobs=4"):
            e.add_request([1, 2, 3], SamplingParams(max_tokens=2, **{field: 5}))
    with pytest.raises(ValueError, match=r"logit_bias token id 256 is invalid: expected ids in \[0, 256\)"):
        e.add_request([1, 2, 3], SamplingParams(logit_bias={256: 1.0}))
    with pytest.raises(ValueError, match=r"stop=\['x'\] is invalid: stop strings need a tokenizer"):
        e.add_request([1, 2, 3], SamplingParams(stop="x"))
    assert len(e.scheduler.requests) == 1
    # LLM.generate checks every request before queueing any
    llm = LLM(untied.path, dtype="float32", max_model_len=32, max_num_seqs=2, block_size=4, max_logprobs=1)
    with pytest.raises(ValueError, match=r"prompt 1: SamplingParams\.logprobs=2 is invalid"):
        llm.generate([[1, 2], [3, 4]], [SamplingParams(max_tokens=2), SamplingParams(max_tokens=2, logprobs=2)])
    assert not llm.engine.has_unfinished_requests()


# ---------------------------------------------------------------------------------
# prompt logprobs: chunked, sub-chunked, preempted
# ---------------------------------------------------------------------------------
def _count_prompt_positions(engine) -> list[int]:
    """Wrap the runner's prompt-logprob step to count the positions it computes."""
    pl = engine.runner.sampling.prompt_logprobs
    inner, counted = pl.compute, []

    def compute(*args, **kw):
        res = inner(*args, **kw)
        if res is not None:
            counted.extend(c for _, _, c, _, _ in res[1])
        return res

    pl.compute = compute
    return counted


def _check_prompt_logprobs(ckpt, out, k):
    p = out.prompt_token_ids
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(p)
    assert out.prompt_logprobs[0] is None
    logits = hf_logits(ckpt, p)
    for t in range(1, len(p)):
        _check_entry(out.prompt_logprobs[t], p[t], logits[t - 1], k, atol=2e-5)


@pytest.mark.parametrize("budget, max_rows", [(None, 1024), (None, 4), (4, 3), (7, 2)])
def test_prompt_logprobs_equal_full_forward(untied, budget, max_rows):
    prompts = random_prompts([30, 11, 1], seed=83)
    e = make_engine(untied, max_num_batched_tokens=budget)
    e.runner.sampling.prompt_logprobs.max_rows = max_rows
    counted = _count_prompt_positions(e)
    rec = Recorder(e)
    outs = run(e, [
        ("long", prompts[0], SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=3, ignore_eos=True)),
        ("short", prompts[1], full_params(n=3, prompt_logprobs=0)),
        ("one", prompts[2], SamplingParams(max_tokens=2, prompt_logprobs=2, ignore_eos=True)),
        ("no", prompts[1], SamplingParams(max_tokens=2)),
    ])
    _check_prompt_logprobs(untied, outs["long"], 3)
    _check_prompt_logprobs(untied, outs["short"], 0)
    assert outs["one"].prompt_logprobs == [None] and outs["no"].prompt_logprobs is None
    assert sum(counted) == 29 + 10, "every prompt position computed exactly once"
    assert outs["long"].token_ids == hf_greedy(untied, prompts[0], 3)
    if budget:
        chunks = [s for s in rec.steps if "long" in s.num_scheduled and s.num_computed["long"] < 30]
        assert len(chunks) >= 30 // budget, "the long prompt should be split several times"


@pytest.mark.parametrize("blocks, budget", [(20, 6), (18, 8)])
def test_prompt_logprobs_survive_preemption(untied, blocks, budget):
    e = make_engine(untied, max_model_len=64, block_size=4, num_kv_blocks=blocks, max_num_batched_tokens=budget)
    e.runner.sampling.prompt_logprobs.max_rows = 4
    counted = _count_prompt_positions(e)
    rec = Recorder(e)
    comp = random_prompts([14, 12, 10], seed=61)
    target = random_prompts([30], seed=62)[0]
    reqs = [(f"c{i}", p, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)) for i, p in enumerate(comp)]
    reqs.append(("T", target, SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=2, ignore_eos=True)))
    outs = run(e, reqs)
    # T was preempted in the middle of its prompt, after some prompt logprobs were reported
    progress = 0
    preempted_mid_prompt = False
    for s in rec.steps:
        if "T" in s.preempted and 0 < progress < len(target):
            preempted_mid_prompt = True
        if "T" in s.num_scheduled:
            progress = s.num_computed["T"] + s.num_scheduled["T"]
    assert preempted_mid_prompt and outs["T"].num_preemptions > 0
    _check_prompt_logprobs(untied, outs["T"], 2)
    assert sum(counted) == len(target) - 1, "a resumed request recomputed prompt logprobs"
    assert outs["T"].token_ids == hf_greedy(untied, target, 4)


# ---------------------------------------------------------------------------------
# penalties, bias and min_tokens on the real logits
# ---------------------------------------------------------------------------------
def _processed(logits, prompt, out_so_far, sp):
    """The pipeline's stages 1-2 written out literally for one row."""
    x = logits.double().clone()
    for t, b in (sp.logit_bias or {}).items():
        x[t] += b
    if len(out_so_far) < sp.min_tokens:
        x[sp.stop_token_ids] = float("-inf")
    seen = set(prompt) | set(out_so_far)
    for t in seen:
        x[t] = x[t] / sp.repetition_penalty if x[t] > 0 else x[t] * sp.repetition_penalty
    for t in set(out_so_far):
        x[t] -= sp.frequency_penalty * out_so_far.count(t)
        x[t] -= sp.presence_penalty
    return x


def test_greedy_with_penalties_bias_and_min_tokens_matches_literal(untied):
    prompt = random_prompts([10], seed=85)[0]
    plain = hf_greedy(untied, prompt, 12)
    sp = SamplingParams(max_tokens=12, temperature=0.0, repetition_penalty=1.8, frequency_penalty=0.6,
                        presence_penalty=0.4, logit_bias={plain[1]: 4.0, plain[2]: -50.0},
                        min_tokens=4, stop_token_ids=[plain[0]])
    e = make_engine(untied, max_num_batched_tokens=4)
    rec = Recorder(e)
    out = run(e, [("P", prompt, sp)])["P"]
    logits = rec.sampling_logits("P", len(prompt))
    assert len(logits) == len(out.token_ids)
    for i, (tok, lg) in enumerate(zip(out.token_ids, logits)):
        want = int(_processed(lg, prompt, out.token_ids[:i], sp).argmax())
        assert tok == want, f"token {i}: {tok} != literal pipeline {want}"
    assert plain[0] not in out.token_ids[:4], "a stop id was sampled before min_tokens"
    assert out.token_ids != plain and plain[2] not in out.token_ids
    if plain[0] in out.token_ids:
        assert out.finish_reason == "stop" and out.stop_reason == plain[0] and out.token_ids[-1] == plain[0]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_holds_back_a_forced_stop_token(untied, temperature):
    """A stop id biased to win every draw is masked for exactly min_tokens tokens."""
    prompt = random_prompts([6], seed=88)[0]
    e = make_engine(untied, max_num_batched_tokens=4)
    outs = run(e, [(f"m{m}", prompt, SamplingParams(max_tokens=10, temperature=temperature, seed=3, min_tokens=m,
                                                    stop_token_ids=[42], logit_bias={42: 100.0}))
                   for m in (0, 1, 4)])
    for m in (0, 1, 4):
        o = outs[f"m{m}"]
        assert o.token_ids[-1] == 42 and 42 not in o.token_ids[:-1] and len(o.token_ids) == m + 1, (m, o.token_ids)
        assert o.finish_reason == "stop" and o.stop_reason == 42


def test_stop_token_id_reports_stop_reason(untied):
    prompt = random_prompts([7], seed=86)[0]
    plain = hf_greedy(untied, prompt, 6)
    e = make_engine(untied)
    out = run(e, [("s", prompt, SamplingParams(max_tokens=6, temperature=0.0, stop_token_ids=[plain[2]]))])["s"]
    assert out.token_ids == plain[: plain.index(plain[2]) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == plain[2]


# ---------------------------------------------------------------------------------
# seeded sampling with every stage on: batch, row, chunking and preemption invariant
# ---------------------------------------------------------------------------------
def test_seeded_full_pipeline_reproducible_everywhere(untied):
    prompt = random_prompts([9], seed=53)[0]
    alone = run(make_engine(untied), [("T", prompt, full_params(logprobs=2))])["T"]
    plain = run(make_engine(untied), [("T", prompt, SamplingParams(max_tokens=N_NEW, seed=321, temperature=0.9,
                                                                    ignore_eos=True))])["T"]
    assert alone.token_ids != plain.token_ids, "the extra stages should change the seeded tokens"
    comp = random_prompts([14, 12, 10], seed=61)
    scenarios = {
        "batch": dict(),
        "chunked": dict(max_num_batched_tokens=5, block_size=3),
        "preempted": dict(max_model_len=64, block_size=4, num_kv_blocks=16, max_num_batched_tokens=8),
    }
    for name, opts in scenarios.items():
        e = make_engine(untied, **opts)
        rec = Recorder(e)
        reqs = [("c0", comp[0], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)),
                ("c1", comp[1], full_params(seed=5, n=12, logprobs=1)),
                ("c2", comp[2], SamplingParams(max_tokens=12, temperature=1.0, top_p=0.5, ignore_eos=True)),
                ("T", prompt, full_params(logprobs=2))]
        outs = run(e, reqs)
        assert outs["T"].token_ids == alone.token_ids, name
        assert set(rec.rows_of("T")) != {0}, f"{name}: T should not sit in the lone run's row"
        for a, b in zip(outs["T"].outputs[0].logprobs, alone.outputs[0].logprobs):
            assert a.keys() == b.keys() and all(abs(a[t].logprob - b[t].logprob) < 1e-5 for t in a)
        if name == "preempted":
            assert outs["T"].num_preemptions > 0


def test_reused_row_forgets_every_setting(untied):
    """A row that held a request with every stage and logprobs on serves a plain greedy
    request exactly as a fresh engine does."""
    e = make_engine(untied, max_num_seqs=2)
    rs = e.runner.req_state
    outs = {}
    x_prompt, y_prompt, z_prompt = random_prompts([12, 20, 9], seed=87)
    e.add_request(x_prompt, full_params(n=3, logprobs=3, prompt_logprobs=2), req_id="X")
    e.add_request(y_prompt, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True), req_id="Y")
    step_until(e, outs, lambda: "X" in outs and "X" not in rs.req_id_to_row)
    row = rs.free_rows[-1]
    e.add_request(z_prompt, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True), req_id="Z")
    step_until(e, outs, lambda: "Z" in rs.req_id_to_row)
    assert rs.req_id_to_row["Z"] == row
    assert all(row not in s.users for s in e.runner.sampling.stages)
    drain(e, outs)
    z = outs["Z"]
    assert z.token_ids == hf_greedy(untied, z_prompt, 10)
    assert z.outputs[0].logprobs is None and z.prompt_logprobs is None and z.stop_reason is None


@pytest.mark.parametrize("other, cuts", [
    (dict(top_p=0.5), True), (dict(top_k=5), True), (dict(min_p=0.1), True),
    (dict(temperature=0.0, top_k=5), False), (dict(), False)])
def test_cut_stage_runs_only_when_a_sampled_row_cuts(untied, monkeypatch, other, cuts):
    """The cut stage gathers its settings exactly when a sampled row of the batch cuts (a
    greedy row's settings do not count), decided from host mirrors."""
    import core_runner.sample.sampler as sampler

    seen = []
    draw_tokens = sampler.draw_tokens

    def spy(x, draw, c, use_triton):
        seen.append(c is not None)
        return draw_tokens(x, draw, c, use_triton)

    monkeypatch.setattr(sampler, "draw_tokens", spy)
    e = make_engine(untied, max_num_seqs=2)
    a, b = random_prompts([6, 7], seed=91)
    run(e, [("A", a, SamplingParams(max_tokens=3, temperature=0.8, seed=1, ignore_eos=True)),
            ("B", b, SamplingParams(max_tokens=3, seed=2, ignore_eos=True, **{"temperature": 0.8, **other}))])
    assert seen and all(s == cuts for s in seen), seen
