"""Speculative decoding through a request's lifecycle: chunked prefill, preemption, abort,
prefix caching, tensor parallelism, the stop rules and the length limits inside a step
that keeps several tokens, and the requests whose settings rule speculation out. Each
compares the outputs with the same engine without speculation. Last, a chi-square test
of the tokens sampled at positions whose input was an accepted proposal.

Which output tokens came from accepted proposals is read from the recorded steps
(``kept_per_step``): all but the last of the tokens a step kept were proposals.
"""
from __future__ import annotations

import copy
import json
import shutil
from collections import Counter, defaultdict

import pytest
import torch
from helpers import Checkpoint, drain, greedy, make_engine, random_prompts, run, step_until
from test_spec_decode import (
    kept_per_step,
    ngram,
    outputs,
    reference_proposals,
    repetitive_prompts,
    seeded,
    self_predicting_prompts,
    tokens,
)

from core_runner import LLM, SamplingParams

K = 4


def accepted_inside(steps, req_id: str, prompt_len: int, out: list[int]) -> list[tuple[int, int, int]]:
    """(j, first, n): output index j was an accepted proposal of the step that kept
    outputs first .. first + n - 1, with more kept after it, and out[j] is new there."""
    found = []
    for first, n, _ in kept_per_step(steps, req_id, prompt_len, len(out)):
        found += [(j, first, n) for j in range(first, first + n - 1) if out[j] not in out[:j]]
    return found


@pytest.fixture(scope="module")
def setting(untied):
    """Prompts of the untied checkpoint (two self-predicting, two repetitive), their greedy
    outputs without speculation, and where a speculative run of them kept accepted
    proposals followed by more tokens (``accepted_inside``)."""
    base = make_engine(untied)
    prompts = self_predicting_prompts(untied.hf, 2) + repetitive_prompts(base, random_prompts([6, 11], seed=5))
    want = tokens(outputs(base, prompts, greedy(24), "ref"))
    engine = make_engine(untied, speculative_config=ngram(K))
    steps = engine.debug.record_steps()
    got = outputs(engine, prompts, greedy(24), "")
    assert tokens(got) == want
    inside = {r: accepted_inside(steps, r, len(prompts[int(r)]), want[r]) for r in want}
    assert any(inside.values()), "no output token came from an accepted proposal"
    return prompts, want, inside


def test_chunked_prefill_preemption_and_abort(untied, setting):
    prompts, want, _ = setting
    engine = make_engine(untied, speculative_config=ngram(K), max_num_batched_tokens=8, max_num_seqs=4)
    total = engine.debug.num_free_blocks
    steps = engine.debug.record_steps()
    plen = {str(i): len(p) for i, p in enumerate(prompts)}
    for i, p in enumerate(prompts):
        engine.add_request(p, greedy(24), req_id=str(i))

    def verifying(rid):
        return lambda: any(s.num_scheduled.get(rid, 0) > 1 and s.num_computed[rid] >= plen[rid] for s in steps)

    done: dict = {}
    step_until(engine, done, verifying("0"))
    engine.debug.preempt("0")
    # prompt logprobs computed chunk by chunk in steps where others verify proposals
    logprobs_params = SamplingParams(max_tokens=8, temperature=0.0, prompt_logprobs=2)
    engine.add_request(prompts[1], logprobs_params, req_id="4")
    plen["4"] = len(prompts[1])
    step_until(engine, done, verifying("2"))
    assert "2" in engine.debug.rows()
    engine.abort_request("2")
    done.update({o.req_id: o for o in engine.step()})
    assert "2" not in engine.debug.rows()
    drain(engine, done)
    assert set(done) == {"0", "1", "3", "4"}
    ref = outputs(make_engine(untied), [prompts[1]], logprobs_params, "lp")["0"]
    assert {r: list(o.outputs[0].token_ids) for r, o in done.items()} == {**{r: want[r] for r in "013"},
                                                                        "4": list(ref.outputs[0].token_ids)}
    for x, y in zip(ref.prompt_logprobs[1:], done["4"].prompt_logprobs[1:], strict=True):
        assert_same_logprobs(x, y)
    assert done["0"].num_preemptions == 1 and done["0"].num_draft_tokens > 0 and done["4"].num_draft_tokens > 0
    engine.step()  # the last finished id reaches the runner
    assert engine.debug.rows() == {} and engine.debug.num_free_blocks == total
    assert max(s.num_tokens for s in steps) <= 8

    def chunk_next_to_verification(s) -> bool:
        sched = s.num_scheduled.items()
        return (any(s.num_computed[r] + n < plen[r] for r, n in sched)
                and any(n > 1 and s.num_computed[r] >= plen[r] for r, n in sched))
    assert sum(chunk_next_to_verification(s) for s in steps) >= 2


def test_a_dry_kv_pool_preempts_speculating_requests(untied, setting):
    prompts, want, _ = setting
    # ~17 blocks per request and 40 in the pool: growing a request by 1 + k slots pushes
    # others out, and they resume (re-prefill, then speculate again)
    engine = make_engine(untied, speculative_config=ngram(K), num_kv_blocks=40)
    got = outputs(engine, prompts, greedy(24), "p")
    assert tokens(got) == want
    assert engine.debug.num_preemptions > 0 and any(o.num_preemptions and o.num_draft_tokens for o in got.values())
    engine.step()
    assert engine.debug.num_free_blocks == 40


def test_prefix_caching_with_speculation(untied, setting):
    prompts, want, _ = setting
    engine = make_engine(untied, speculative_config=ngram(K), enable_prefix_caching=True)
    first = outputs(engine, prompts, greedy(24), "a")
    # the same prompts again hit the blocks the first run filled, and a prompt that is a
    # whole first-run sequence hits the blocks written by its verification steps, where
    # rejected proposals' KV had been written and then overwritten
    full = prompts[0] + want["0"]
    base = make_engine(untied, enable_prefix_caching=False)
    want_full = tokens(outputs(base, [full], greedy(8), "f"))["0"]
    again = outputs(engine, prompts + [full], [greedy(24)] * len(prompts) + [greedy(8)], "b")
    assert tokens(first) == want
    assert {r: t for r, t in tokens(again).items() if r != "4"} == want
    assert tokens(again)["4"] == want_full
    assert all(again[r].num_cached_tokens > 0 for r in again)
    assert again["4"].num_cached_tokens >= len(full) - 4
    assert sum(o.num_accepted_tokens for o in again.values()) > 0


def test_tensor_parallel_with_speculation(untied, setting, single_torch_thread):
    prompts = setting[0]
    params = [greedy(24)] * 2 + [seeded(24, 5, 1.0), seeded(24, 6, 0.7, 0.9)]
    base = make_engine(untied)
    want_seeded = tokens(outputs(base, prompts, params, "ref"))
    llm = LLM(untied.path, tensor_parallel_size=2, speculative_config=ngram(K), device="cpu", dtype="float32",
              max_model_len=128, block_size=4, max_num_seqs=4, max_num_batched_tokens=16, num_kv_blocks=128)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.engine.shutdown()
    assert [list(o.outputs[0].token_ids) for o in outs] == [want_seeded[str(i)] for i in range(len(prompts))]
    assert sum(o.num_accepted_tokens for o in outs) > 0


def test_max_tokens_reached_inside_accepted_proposals(untied, setting):
    prompts, want, inside = setting
    rid = next(r for r in sorted(inside) if inside[r])
    j = inside[rid][0][0]  # j + 1 tokens end inside a step that would keep more
    engine = make_engine(untied, speculative_config=ngram(K))
    steps = engine.debug.record_steps()
    got = outputs(engine, [prompts[int(rid)]], greedy(j + 1), "m")["0"]
    assert list(got.outputs[0].token_ids) == want[rid][:j + 1]
    assert got.outputs[0].finish_reason == "length"
    # the last step proposed only what max_tokens left room for
    last = [s.num_scheduled["m0"] for s in steps if "m0" in s.num_scheduled][-1]
    assert last < 1 + K


def test_stop_token_inside_accepted_proposals(untied, setting, tmp_path):
    prompts, want, inside = setting
    rid = next(r for r in sorted(inside) if inside[r])
    j, first, n = inside[rid][0]
    stop = want[rid][j]
    prompt = prompts[int(rid)]
    engine = make_engine(untied, speculative_config=ngram(K))
    steps = engine.debug.record_steps()
    got = outputs(engine, [prompt], SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=[stop]), "s")["0"]
    assert list(got.outputs[0].token_ids) == want[rid][:j + 1]
    assert (got.outputs[0].finish_reason, got.outputs[0].stop_reason) == ("stop", stop)
    # it stopped in the step that kept outputs first .. first + n - 1 without the stop: the
    # proposals after j, and the token sampled after them, were dropped
    last = [s.num_computed["s0"] for s in steps if "s0" in s.num_scheduled][-1]
    assert last == len(prompt) + first - 1 and j + 1 < first + n
    # the same token as EOS: a copy of the checkpoint whose generation config names it
    eos_dir = tmp_path / "eos"
    shutil.copytree(untied.path, eos_dir)
    (eos_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": stop}))
    eos = Checkpoint("eos", str(eos_dir), untied.hf)
    for spec in (None, ngram(K)):
        engine = make_engine(eos, speculative_config=spec)
        assert engine.eos_token_ids == (stop,)
        stopped = outputs(engine, [prompt], SamplingParams(max_tokens=24, temperature=0.0), "e")["0"]
        assert list(stopped.outputs[0].token_ids) == want[rid][:j + 1]
        assert (stopped.outputs[0].finish_reason, stopped.outputs[0].stop_reason) == ("stop", None)
        ignored = outputs(engine, [prompt], greedy(24), "i")["0"]  # greedy() ignores EOS
        assert list(ignored.outputs[0].token_ids) == want[rid]


def test_max_model_len_reached_while_speculating(untied, setting):
    prompts, want, _ = setting
    # room for 3 tokens: the prefill's, then one step that may verify one proposal only
    # (an explicit max_tokens above the room is refused; the default 16 is cut to it)
    for i, max_tokens in ((0, "default"), (1, None)):  # None: until max_model_len
        prompt, rid = prompts[i], f"l{i}"
        engine = make_engine(untied, max_model_len=len(prompt) + 3, speculative_config=ngram(K))
        steps = engine.debug.record_steps()
        params = SamplingParams(temperature=0.0) if max_tokens == "default" else \
            SamplingParams(max_tokens=max_tokens, temperature=0.0)
        got = outputs(engine, [prompt], params, rid)["0"]
        assert list(got.outputs[0].token_ids) == want[str(i)][:3]
        assert got.outputs[0].finish_reason == "length"
        scheduled = [(s.num_computed[rid + "0"], s.num_scheduled[rid + "0"]) for s in steps
                     if rid + "0" in s.num_scheduled]
        assert scheduled[-1] == (len(prompt), 2) and got.num_accepted_tokens == 1


def test_requests_that_cannot_speculate_decode_one_token_per_step(untied, setting):
    prompts, want, _ = setting
    # min_tokens holds back a stop token that greedy decoding gives as a new output at 4 or later
    out = want["2"]
    stop = next(t for j, t in enumerate(out) if j >= 4 and t not in out[:j])
    no_spec = [
        SamplingParams(max_tokens=12, temperature=0.0, repetition_penalty=1.3),
        SamplingParams(max_tokens=12, temperature=0.8, seed=3, frequency_penalty=0.5, presence_penalty=0.4),
        SamplingParams(max_tokens=12, temperature=0.0, min_tokens=out.index(stop) + 1, stop_token_ids=[stop]),
        SamplingParams(max_tokens=12, temperature=0.0, logit_bias={5: 3.0, 9: -2.0}),
        SamplingParams(max_tokens=12, temperature=0.8, seed=4, logprobs=3),
    ]
    spec = [SamplingParams(max_tokens=12, temperature=0.0, prompt_logprobs=2), greedy(12)]
    batch = [prompts[i % len(prompts)] for i in range(len(no_spec) + len(spec))]
    params = no_spec + spec
    ref = outputs(make_engine(untied), batch, params, "r")
    got = outputs(make_engine(untied, speculative_config=ngram(K)), batch, params, "x")
    assert tokens(got) == tokens(ref)
    held = out.index(stop)
    assert tokens(ref)["2"][:held] == out[:held] and tokens(ref)["2"][held] != stop  # held back there
    assert [got[str(i)].num_draft_tokens for i in range(len(no_spec))] == [0] * len(no_spec)
    assert all(got[str(i)].num_draft_tokens > 0 for i in range(len(no_spec), len(batch)))
    for r in ref:
        a, b = ref[r].outputs[0], got[r].outputs[0]
        assert (a.finish_reason, a.stop_reason) == (b.finish_reason, b.stop_reason)
        assert (a.logprobs is None) == (r != "4") and (ref[r].prompt_logprobs is None) == (r != "5")
        for x, y in zip(*(o.logprobs or [] for o in (a, b))):
            assert_same_logprobs(x, y)
        for x, y in zip(*(o.prompt_logprobs[1:] if o.prompt_logprobs else [] for o in (ref[r], got[r]))):
            assert_same_logprobs(x, y)


def assert_same_logprobs(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert all(abs(a[t].logprob - b[t].logprob) <= 1e-5 and a[t].rank == b[t].rank for t in a)


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory, single_torch_thread):
    """A tiny Qwen3 with a byte-level tokenizer (one token per printable ASCII byte), so
    that its outputs decode to text that stop strings are found in."""
    import transformers
    from test_sampler_stop import EOS, byte_tokenizer

    path = tmp_path_factory.mktemp("spec_bytes")
    tok = byte_tokenizer(range(0x20, 0x7F))
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "clean_up_tokenization_spaces": False}))
    cfg = transformers.Qwen3Config(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        initializer_range=0.15, eos_token_id=tok.token_to_id(EOS), bos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(cfg).eval()
    hf.save_pretrained(path)
    return Checkpoint("bytes", str(path), hf, vocab=tok.get_vocab_size() - 1)


def test_stop_string_inside_accepted_proposals(byte_model):
    base = make_engine(byte_model)
    prompts = self_predicting_prompts(byte_model.hf, 2, vocab=byte_model.vocab)
    full = outputs(base, prompts, greedy(24), "ref")
    engine = make_engine(byte_model, speculative_config=ngram(K))
    steps = engine.debug.record_steps()
    assert tokens(outputs(engine, prompts, greedy(24), "")) == tokens(full)
    # a two-character stop string first completed by an accepted proposal's text
    decode = engine.tokenizer.decode
    cases = []
    for r, o in sorted(full.items()):
        out = list(o.outputs[0].token_ids)
        for first, n, _ in kept_per_step(steps, r, len(prompts[int(r)]), len(out)):
            for j in range(first, first + n - 1):
                before, text = decode(out[:j]), decode(out[:j + 1])
                if len(text) > len(before) and len(text) >= 2 and text[-2:] not in before:
                    cases.append((r, j, text))
    assert cases, "no accepted proposal completes a new two-character string"
    r, j, text = cases[0]
    params = SamplingParams(max_tokens=24, temperature=0.0, stop=[text[-2:]])
    want = outputs(base, [prompts[int(r)]], params, "w")["0"].outputs[0]
    got = outputs(engine, [prompts[int(r)]], params, "g")["0"].outputs[0]
    assert list(got.token_ids) == list(want.token_ids) == list(full[r].outputs[0].token_ids)[:j + 1]
    assert (got.text, got.finish_reason, got.stop_reason) == (want.text, "stop", text[-2:])
    assert got.text == text[:-2]


# ---------------------------------------------------------------------------------
# the distribution of tokens sampled at positions reached through accepted proposals
# ---------------------------------------------------------------------------------
CHI2_P_MIN = 1e-3  # a correct sampler fails this once in a thousand seed sets; ours are fixed
SEEDS = 1000


@pytest.fixture(scope="module")
def peaked(untied, tmp_path_factory):
    """The untied checkpoint with its LM head x3: next-token distributions put 0.3-0.7 on
    their top tokens instead of ~0.05, so proposals are accepted under T = 1.0 often
    enough to count, while several tokens keep a sizeable share."""
    hf = copy.deepcopy(untied.hf)
    with torch.no_grad():
        hf.lm_head.weight.mul_(3.0)
    path = tmp_path_factory.mktemp("spec_peaked") / "peaked"
    hf.save_pretrained(str(path))
    return Checkpoint("peaked", str(path), hf)


def target_probs(hf, seq: list[int], temperature: float, top_p: float) -> torch.Tensor:
    """The distribution sampling should follow at the end of seq: softmax(logits / T),
    cut to the smallest set of top tokens whose mass reaches top_p, renormalised."""
    with torch.no_grad():
        p = torch.softmax(hf(torch.tensor([seq])).logits[0, -1].double() / temperature, -1)
    s, idx = p.sort(descending=True)
    keep = (s.cumsum(0) - s) < top_p
    out = torch.zeros_like(p)
    out[idx[keep]] = s[keep]
    return out / out.sum()


def chi_square(counts: Counter, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom: one bin per token expected at least 5
    times, the rest pooled (into the smallest bin when the pool itself is under 5)."""
    n = sum(counts.values())
    expected = probs * n
    order = expected.argsort(descending=True).tolist()
    bins = [[t] for t in order if expected[t] >= 5]
    rest = [t for t in order if expected[t] < 5]
    if sum(expected[t].item() for t in rest) >= 5:
        bins.append(rest)
    elif bins:
        bins[-1] += rest
    stat = 0.0
    for b in bins:
        o, e = sum(counts.get(t, 0) for t in b), sum(expected[t].item() for t in b)
        stat += (o - e) ** 2 / e
    return stat, len(bins) - 1


def p_value(stat: float, df: int) -> float:
    """Upper tail of the chi-square distribution: Q(df / 2, stat / 2) (no scipy)."""
    return torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                   torch.tensor(stat / 2, dtype=torch.float64)).item()


@pytest.mark.parametrize("temperature,top_p,other", [(1.0, 1.0, 0.7), (0.7, 0.9, 1.0)])
def test_tokens_after_accepted_proposals_follow_the_target_distribution(peaked, temperature, top_p, other):
    """SEEDS requests of one prompt, 5 tokens each: the prefill samples t1, the next step
    verifies min(4, room) = 3 proposals d. Where t2 == d1 (and t3 == d2), t3 (t4) was
    sampled at a position whose input was an accepted proposal. Grouped by their prefix
    (an event fixed before their own noise is drawn, so no selection bias), their counts
    are compared with the HF model's probabilities there (summed statistic, p >= 1e-3)."""
    prompt = self_predicting_prompts(peaked.hf, 1)[0]
    k = 3  # max_tokens 5 leaves room for 3 proposals after the first token
    engine = make_engine(peaked, max_num_seqs=64, max_model_len=64, speculative_config=ngram(4, 1, 2))
    outs = run(engine, [(f"s{i}", prompt, seeded(5, i, temperature, top_p)) for i in range(SEEDS)])
    groups: dict[tuple[int, ...], Counter] = defaultdict(Counter)
    for o in outs.values():
        t = list(o.outputs[0].token_ids)
        d = reference_proposals(prompt + t[:1], k, 1, 2)
        for i in (2, 3):
            if t[1:i] == d[:i - 1]:
                assert o.num_accepted_tokens >= i - 1  # the engine kept those proposals
                groups[tuple(t[:i])][t[i]] += 1
    assert sum(sum(c.values()) for c in groups.values()) >= SEEDS // 3, "too few accepted proposals to test"
    stat = df = 0
    wrong_stat = wrong_df = 0
    for prefix, counts in groups.items():
        probs = target_probs(peaked.hf, prompt + list(prefix), temperature, top_p)
        assert all(probs[t] > 0 for t in counts), f"a token outside the top-p nucleus was sampled after {prefix}"
        s, f = chi_square(counts, probs)
        stat, df = stat + s, df + f
        # the test can tell: the distribution at another temperature is rejected
        s, f = chi_square(counts, target_probs(peaked.hf, prompt + list(prefix), other, 1.0))
        wrong_stat, wrong_df = wrong_stat + s, wrong_df + f
    assert df >= 3
    assert p_value(stat, df) >= CHI2_P_MIN, (stat, df, dict(groups))
    assert p_value(wrong_stat, wrong_df) < CHI2_P_MIN
