"""Speculative decoding (n-gram, ``speculative_config``): the device pieces against plain
Python, the config and the oracle, and the engine's outputs against the same engine
without speculation.

Every position is sampled with the request's (seed, position) noise whether or not it
is verified together with proposals, so greedy and seeded outputs must be identical
with and without speculation (the logits of a position computed in a 1 + k token step
equal those of a one-token step up to float32 rounding, far below the checkpoints'
argmax gaps). ``tests/test_spec_decode_engine.py`` checks the sampled distribution
itself (chi-square) and a request's lifecycle (chunked prefill, preemption, abort,
prefix caching, stops, limits, TP).
"""
from __future__ import annotations

import random

import pytest
import torch
from helpers import Checkpoint, greedy, hf_logits, make_engine, random_prompts, run

from core_runner import SamplingParams
from core_runner.config import EngineConfig
from core_runner.oracle import UnsupportedError, plan_execution
from core_runner.plugins import load_plugins
from core_runner.runner.spec_decode import accept, propose_ngram, verification_view, write_proposals
from core_runner.speculative_config import SpeculativeConfig
from core_runner.step_data.input_batch import InputBatch


def ngram(k: int, lo: int = 1, hi: int = 3) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo, "prompt_lookup_max": hi}


def reference_proposals(tokens: list[int], k: int, lo: int, hi: int, with_match: bool = False):
    """What ``propose_ngram`` promises, written out: the k tokens after the most recent
    earlier occurrence of the longest suffix of length n in [lo, hi] that has one,
    clipped to the known tokens and padded with the last token (also a row's answer
    when no suffix recurs); ``with_match``: also whether one recurred."""
    for n in range(hi, lo - 1, -1):
        if len(tokens) < n + 1:
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                cont = tokens[start + n:start + n + k]
                out = cont + [tokens[-1]] * (k - len(cont))
                return (out, True) if with_match else out
    return ([tokens[-1]] * k, False) if with_match else [tokens[-1]] * k


# ---------------------------------------------------------------------------------
# the device pieces
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("k,lo,hi", [(1, 1, 1), (3, 1, 3), (4, 2, 4), (5, 3, 3), (2, 1, 6)])
def test_propose_ngram_equals_reference(k, lo, hi):
    rng = random.Random(k * 100 + lo * 10 + hi)
    width, num_rows = 24, 9
    for trial in range(20):
        # a 3-token vocabulary makes suffixes recur at every length; the columns past a
        # row's length hold the same tokens, so a window reaching them would match too
        table = torch.tensor([[rng.randrange(3) for _ in range(width)] for _ in range(num_rows)], dtype=torch.int32)
        lengths = [rng.choice([1, 2, 3, hi, hi + 1, rng.randrange(1, width + 1), width]) for _ in range(num_rows)]
        num_tokens = torch.tensor(lengths, dtype=torch.int32)
        rows = torch.tensor(rng.sample(range(num_rows), 6))  # a subset, out of order
        got, matched = propose_ngram(table, rows, num_tokens, k, lo, hi)
        assert got.shape == (6, k) and matched.shape == (6,)
        for i, r in enumerate(rows.tolist()):
            known = table[r, :lengths[r]].tolist()
            assert (got[i].tolist(), bool(matched[i])) == reference_proposals(known, k, lo, hi, True), (trial, known)


def test_propose_ngram_prefers_the_longest_then_the_latest_match():
    #          0  1  2  3  4  5  6  7  8  9 10
    tokens = [[5, 1, 2, 7, 9, 2, 8, 1, 2, 6, 2]]
    table = torch.tensor([tokens[0] + [0] * 5], dtype=torch.int32)
    rows, n = torch.tensor([0]), torch.tensor([11], dtype=torch.int32)
    # suffix [2] recurs at 2, 5 and 8: the latest (8) is followed by 6, 2
    assert propose_ngram(table, rows, n, 2, 1, 1)[0].tolist() == [[6, 2]]
    # [6, 2] never recurs, so n = 2 falls back to n = 1; with n >= 2 only, nothing matches
    assert propose_ngram(table, rows, n, 2, 1, 2)[0].tolist() == [[6, 2]]
    assert [t.tolist() for t in propose_ngram(table, rows, n, 3, 2, 3)] == [[[2, 2, 2]], [False]]
    # known tokens end at 9 ([.., 1, 2]): the latest earlier [1, 2] is at 1 (then 7, 9, 2)
    assert propose_ngram(table, rows, torch.tensor([9], dtype=torch.int32), 3, 2, 2)[0].tolist() == [[7, 9, 2]]


def test_write_proposals_stays_inside_the_table():
    width = 10
    table = torch.arange(4 * width, dtype=torch.int32).view(4, width) + 1000
    before = table.clone()
    rows = torch.tensor([3, 0, 2])
    num_tokens = torch.tensor([7, 1, 10, width - 2], dtype=torch.int32)  # row 2 full, row 3 two short
    proposals = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    write_proposals(table, rows, num_tokens, proposals)
    want = before.clone()
    want[3, 8:] = torch.tensor([1, 2])  # the rest fall past the table and are dropped
    want[0, 7:] = torch.tensor([5, 6, 7])
    assert torch.equal(table, want)  # row 1 (not listed) and the full row 2 untouched


def _batch(q_lens: list[int], computed: list[int], rows: list[int]) -> InputBatch:
    """A step's InputBatch as the runner builds it, for the fields verification reads."""
    qsl = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    positions = torch.cat([torch.arange(c, c + q) for c, q in zip(computed, q_lens)])
    seq = torch.tensor([c + q for c, q in zip(computed, q_lens)], dtype=torch.int32)
    n, t = len(q_lens), sum(q_lens)
    idx = torch.tensor(rows, dtype=torch.int32)
    return InputBatch(
        req_ids=[f"r{i}" for i in range(n)], num_reqs=n, num_tokens=t, idx_mapping=idx, idx_mapping_cpu=idx,
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq, seq_lens_cpu=seq,
        num_computed_cpu=torch.tensor(computed, dtype=torch.int32), input_ids=torch.zeros(t, dtype=torch.int64),
        positions=positions, slot_mapping=torch.zeros(t, dtype=torch.int64), block_tables=torch.zeros(n, 4),
        logits_indices=qsl[1:] - 1, max_query_len=max(q_lens), max_seq_len=int(seq.max()),
    )


def test_verification_view_expands_each_request_to_its_positions():
    # r0 verifies 2 proposals, r1 decodes one token, r2 ends a prefill chunk, r3 verifies 4
    counts = [2, 0, 0, 4]
    batch = _batch(q_lens=[3, 1, 6, 5], computed=[10, 4, 0, 20], rows=[5, 1, 2, 7])
    v = verification_view(batch, counts)
    assert v.logits_indices.tolist() == [0, 1, 2, 3, 9, 10, 11, 12, 13, 14]
    assert v.first.tolist() == [0, 3, 4, 5]
    assert v.view.req_ids == ["r0"] * 3 + ["r1", "r2"] + ["r3"] * 5
    assert v.view.idx_mapping.tolist() == [5, 5, 5, 1, 2, 7, 7, 7, 7, 7]
    # each row samples the position after its input token, with the noise key seq_len
    want_seq = [11, 12, 13, 5, 6, 21, 22, 23, 24, 25]
    assert v.view.seq_lens.tolist() == want_seq and v.view.seq_lens_cpu.tolist() == want_seq
    assert v.view.num_computed_cpu.tolist() == [s - 1 for s in want_seq]


def reference_accept(target: list[list[int]], proposals: list[list[int]]) -> tuple[list[int], list[int]]:
    """Per request: proposals kept while each equals the token sampled before it, and
    the token sampled after the last kept one."""
    accepted, final = [], []
    for t, d in zip(target, proposals):
        a = 0
        while a < len(d) and t[a] == d[a]:
            a += 1
        accepted.append(a)
        final.append(t[a])
    return accepted, final


def _accept_case(counts: list[int], target: list[list[int]], proposals: list[list[int]]):
    """accept() on a batch whose request i verifies ``proposals[i]`` and samples ``target[i]``
    (len k + 1) at its positions; the proposals sit after 6 known tokens in the table."""
    n = len(counts)
    batch = _batch(q_lens=[k + 1 for k in counts], computed=[5] * n, rows=list(range(n - 1, -1, -1)))
    v = verification_view(batch, counts)
    table = torch.full((n, 16), -1, dtype=torch.int32)
    for i, d in enumerate(proposals):
        table[n - 1 - i, 6:6 + len(d)] = torch.tensor(d, dtype=torch.int32)
    sampled = torch.tensor([tok for t in target for tok in t])
    return accept(sampled, v, batch.idx_mapping.long(), torch.full((n,), 6, dtype=torch.int32), table)


def test_accept_hand_built_cases():
    counts = [3, 3, 3, 0, 1, 4]
    proposals = [[7, 8, 9], [7, 8, 9], [7, 8, 9], [], [4], [1, 2, 3, 4]]
    target = [
        [7, 8, 9, 10],  # all kept: a = k, the final token is the one sampled after them
        [5, 8, 9, 10],  # first mismatch at the first proposal: a = 0, final = the sampled 5
        [7, 6, 9, 10],  # mismatch at the second; the later match (9) does not count
        [42],  # k = 0: a plain decode
        [4, 11],
        [1, 2, 3, 0, 12],
    ]
    accepted, final, per_position = _accept_case(counts, target, proposals)
    assert accepted.tolist() == [3, 0, 1, 0, 1, 3]
    assert final.tolist() == [10, 5, 6, 42, 11, 0]
    assert per_position[0].tolist() == [7, 8, 9, 10, 10]  # [n, kmax + 1], short rows repeat their last
    # a step of plain decodes only
    accepted, final, _ = _accept_case([0, 0], [[3], [4]], [[], []])
    assert accepted.tolist() == [0, 0] and final.tolist() == [3, 4]


def test_accept_equals_reference_on_random_cases():
    rng = random.Random(3)
    for _ in range(50):
        counts = [rng.randrange(0, 5) for _ in range(rng.randrange(1, 6))]
        proposals = [[rng.randrange(3) for _ in range(k)] for k in counts]
        target = [[rng.randrange(3) for _ in range(k + 1)] for k in counts]
        accepted, final, _ = _accept_case(counts, target, proposals)
        assert (accepted.tolist(), final.tolist()) == reference_accept(target, proposals), (counts, target, proposals)


# ---------------------------------------------------------------------------------
# configuration and the oracle
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("value,match", [
    ({"method": "medusa", "num_speculative_tokens": 2},
     r"\['method'\]='medusa' is invalid: expected one of \['ngram', 'mtp', 'eagle', 'eagle3'\]"),
    ({"num_speculative_tokens": 2}, r"\['method'\]=None is invalid"),
    (ngram(0), r"\['num_speculative_tokens'\]=0 is invalid: expected an integer in 1\.\.16"),
    (ngram(17), r"=17 is invalid: expected an integer in 1\.\.16"),
    ({"method": "ngram", "num_speculative_tokens": "3"}, r"\['num_speculative_tokens'\]='3' is invalid"),
    ({"method": "ngram", "num_speculative_tokens": True}, r"\['num_speculative_tokens'\]=True is invalid"),
    (ngram(2, lo=4, hi=2), r"\['prompt_lookup_min'\]=4 is invalid: expected at most prompt_lookup_max=2"),
    (ngram(2, lo=0, hi=2), r"\['prompt_lookup_min'\]=0 is invalid: expected an integer >= 1"),
    ({**ngram(2), "draft_tensor_parallel_size": 1},
     r"unknown keys \['draft_tensor_parallel_size'\]: expected some of \['method'"),
    ({**ngram(2), "model": "some/draft"}, r"\['model'\]='some/draft' is invalid: method 'ngram' takes no draft model"),
    ("ngram", r"speculative_config='ngram' is invalid: expected None or a dict"),
    ({"method": "eagle", "num_speculative_tokens": 2}, r"\['model'\]=None is invalid: method 'eagle' needs the "
                                                        r"draft checkpoint's path"),
    ({"method": "eagle3", "num_speculative_tokens": 2, "model": ""}, r"\['model'\]='' is invalid"),
    ({"method": "mtp", "num_speculative_tokens": 1, "model": "x"}, r"method 'mtp' takes no draft model \(its draft "
                                                                   r"layers are in the target's checkpoint\)"),
    ({"method": "mtp", "num_speculative_tokens": 1, "prompt_lookup_max": 3},
     r"\['prompt_lookup_max'\]=3 is invalid: only method 'ngram' looks up prompts"),
])
def test_bad_speculative_config_is_named(value, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(model="x", speculative_config=value)


def test_speculative_config_bounds_follow_vllm():
    parse = SpeculativeConfig.parse
    assert parse(None) is None
    s = parse({"method": "ngram", "num_speculative_tokens": 3})
    assert (s.prompt_lookup_min, s.prompt_lookup_max) == (5, 5)
    s = parse({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2})
    assert (s.prompt_lookup_min, s.prompt_lookup_max) == (2, 2)  # the bound left out takes the other's
    assert EngineConfig(model="x", speculative_config=ngram(4)).speculative_config == SpeculativeConfig(
        "ngram", 4, None, 1, 3)


@pytest.fixture(scope="module")
def registry():
    return load_plugins().registry


@pytest.mark.parametrize("arch", ["Qwen3Model"])
def test_families_without_the_capability_refuse_speculation(registry, arch):
    with pytest.raises(UnsupportedError, match=f"speculative_config \\(method 'ngram'\\) needs the "
                                               f"speculative_decoding capability, which {arch} declares unsupported"):
        plan_execution(EngineConfig(model="x", speculative_config=ngram(2), strict=False), registry.get(arch))


def test_granite_hybrid_plans_speculation(registry):
    """The hybrid declares speculation (docs/hybrid_speculation.md): the plan keeps it."""
    plan = plan_execution(EngineConfig(model="x", speculative_config=ngram(2), strict=True),
                          registry.get("GraniteMoeHybridForCausalLM"))
    assert plan.num_speculative_tokens == 2


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM",
                                  "DeepseekV3ForCausalLM", "LlamaForCausalLM"])
def test_speculation_keeps_async_scheduling(registry, arch):
    """The scheduler plans the next step from upper bounds while a verification step is in
    flight (the device holds the true counts), so speculation needs no synchronous loop."""
    reg = registry.get(arch)
    plan = plan_execution(EngineConfig(model="x", async_scheduling=True, speculative_config=ngram(3), strict=True),
                          reg)
    assert (plan.async_scheduling, plan.num_speculative_tokens, plan.downgrades) == (True, 3, ())
    # not asked for (CPU default): off, and nothing to downgrade
    plan = plan_execution(EngineConfig(model="x", speculative_config=ngram(3), strict=True), reg)
    assert (plan.async_scheduling, plan.downgrades) == (False, ())


# ---------------------------------------------------------------------------------
# engine outputs with and without speculation
# ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def families(tmp_path_factory, untied):
    """One tiny random checkpoint per family declaring speculative_decoding, built as
    their own test files build them."""
    import test_deepseek
    import test_qwen3_moe
    import test_tp_template
    import transformers

    root = tmp_path_factory.mktemp("spec_families")
    out = {"qwen3": untied, "deepseek_v2": test_deepseek.build_deepseek(root, "v2-greedy-qlora")}
    extra, seed = test_qwen3_moe.CONFIGS["norm-mlp-only"]
    torch.manual_seed(seed)
    cfg = transformers.Qwen3MoeConfig(**{**test_qwen3_moe.BASE, **extra})
    hf = transformers.Qwen3MoeForCausalLM(cfg).float().eval()
    hf.save_pretrained(str(root / "moe"))
    out["qwen3_moe"] = Checkpoint("qwen3_moe", str(root / "moe"), hf)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**test_tp_template.BASE, **test_tp_template.CHECKPOINTS["gqa"])
    hf = transformers.LlamaForCausalLM(cfg).float().eval()
    hf.save_pretrained(str(root / "llama"))
    out["template"] = Checkpoint("template", str(root / "llama"), hf, vocab=test_tp_template.VOCAB)
    return out


def repetitive_prompts(engine, seeds: list[list[int]], n: int = 40) -> list[list[int]]:
    """Each seed prompt followed by its own greedy continuation: a random model's greedy
    path falls into loops, which the n-gram proposer then predicts."""
    outs = run(engine, [(f"warm{i}", p, greedy(n)) for i, p in enumerate(seeds)])
    return [p + list(outs[f"warm{i}"].outputs[0].token_ids) for i, p in enumerate(seeds)]


def self_predicting_prompts(hf, count: int, m: int = 3, vocab: int = 256) -> list[list[int]]:
    """Prompts [s, g1..gm] + R (R random, s = R[-1]) whose greedy continuation is g1..gm:
    after g1 the n-gram proposer proposes g2, g3, .. from the prompt's start, and greedy
    decoding accepts them. Found by iterating g <- greedy(prompt) to a fixed point, over
    random R until ``count`` converge (a random model's greedy path depends on the whole
    prompt, so some R never settle)."""
    found = []
    for seed in range(64):
        r = random_prompts([40], seed=seed, vocab=vocab)[0]
        prompt = r
        for _ in range(8):
            seq = list(prompt)
            with torch.no_grad():
                for _ in range(m):
                    seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
            if seq[len(prompt):] == prompt[1:1 + m]:
                found.append(prompt)
                break
            prompt = [r[-1]] + seq[len(prompt):] + r
        if len(found) == count:
            return found
    raise AssertionError(f"only {len(found)} of {count} self-predicting prompts found: the checkpoint changed")


def outputs(engine, prompts: list[list[int]], params, tag: str) -> dict:
    plist = params if isinstance(params, list) else [params] * len(prompts)
    outs = run(engine, [(f"{tag}{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, plist))])
    return {r.removeprefix(tag): o for r, o in outs.items()}


def tokens(outs: dict) -> dict:
    return {r: list(o.outputs[0].token_ids) for r, o in outs.items()}


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe", "deepseek_v2", "template"])
def test_greedy_equal_with_and_without_speculation(families, family):
    ckpt = families[family]
    base = make_engine(ckpt, max_model_len=96)
    rand = random_prompts([3, 9, 17], seed=21, vocab=ckpt.vocab)
    rep = repetitive_prompts(base, random_prompts([6, 11, 14], seed=5, vocab=ckpt.vocab))
    prompts = rand + rep
    want = tokens(outputs(base, prompts, greedy(16), "ref"))
    for k in (1, 4):
        engine = make_engine(ckpt, max_model_len=96, speculative_config=ngram(k))
        steps = engine.debug.record_steps()
        got = outputs(engine, prompts, greedy(16), f"k{k}-")
        assert tokens(got) == want, f"{family} k={k}"
        for i, p in enumerate(prompts):
            assert assert_final_logits_match_hf(ckpt, steps, f"k{k}-{i}", p, want[str(i)]) >= 15 // (k + 1)
        drafted = [got[str(i)].num_draft_tokens for i in range(len(prompts))]
        # a request is verified only after its lookup matched: the repetitive ones always do
        assert all(d > 0 for d in drafted[len(rand):]), f"{family} k={k}: repetitive requests speculate ({drafted})"
        assert all(got[str(i)].num_draft_tokens <= k * 15 for i in range(len(prompts)))
        accepted = sum(got[str(i)].num_accepted_tokens for i in range(len(rand), len(prompts)))
        assert accepted > 0, f"{family} k={k}: the repetitive prompts had no proposal accepted"
        sch = engine.scheduler  # the metrics' counters add up the requests' own
        assert sch.spec_num_draft_tokens == sum(drafted)
        assert sch.spec_num_accepted_tokens == sum(o.num_accepted_tokens for o in got.values())


def kept_per_step(steps, req_id: str, prompt_len: int, num_out: int) -> list[tuple[int, int, object]]:
    """(first output index, tokens kept, StepRecord) of each decoding step of req_id (no
    preemption). A decoding step starts at num_computed = known tokens - 1, so a step
    starting at c kept outputs c - prompt_len + 1 up to the next step's first (the
    prefill kept output 0); all but the last of them were accepted proposals."""
    decoding = [s for s in steps if req_id in s.num_scheduled and s.num_computed[req_id] >= prompt_len]
    starts = [s.num_computed[req_id] - prompt_len + 1 for s in decoding]
    return [(a, b - a, s) for a, b, s in zip(starts, starts[1:] + [num_out], decoding)]


def assert_final_logits_match_hf(ckpt: Checkpoint, steps, req_id: str, prompt: list[int], out: list[int]) -> int:
    """The logits a verification step reports (those of the token it sampled after the
    kept proposals) equal HF's at that position: the KV of accepted proposals is right
    and rejected proposals' slots were rewritten. Returns the number of steps checked."""
    ref = hf_logits(ckpt, prompt + out[:-1])
    checked = 0
    for first, n, step in kept_per_step(steps, req_id, len(prompt), len(out)):
        pos = len(prompt) + first + n - 2  # the position whose next token is out[first + n - 1]
        err = (step.logits[req_id] - ref[pos]).abs().max().item()
        assert err <= 1e-4, f"{ckpt.name} {req_id}: logits at position {pos} differ from HF by {err:.3g}"
        checked += 1
    return checked


def seeded(n: int, seed: int, temperature: float, top_p: float = 1.0) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=temperature, top_p=top_p, seed=seed, ignore_eos=True)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_seeded_sampling_equal_with_and_without_speculation(untied, temperature, top_p):
    base = make_engine(untied)
    rep = repetitive_prompts(base, random_prompts([5, 12], seed=8))
    prompts = rep + random_prompts([4, 20], seed=9)
    params = [seeded(14, 100 + i, temperature, top_p) for i in range(len(prompts))]
    # others in the batch: greedy, and sampled with other settings
    others = random_prompts([7, 3], seed=10)
    other_params = [greedy(10), seeded(10, 7, 1.3, 0.8)]
    want = tokens(outputs(base, prompts, params, "ref"))
    want_others = tokens(outputs(base, others, other_params, "oref"))
    engine = make_engine(untied, speculative_config=ngram(4))
    for i, (p, sp) in enumerate(zip(prompts, params)):  # each alone
        alone = outputs(engine, [p], sp, f"alone{i}-")
        assert tokens(alone)["0"] == want[str(i)], f"request {i} alone"
    batch = outputs(engine, prompts + others, params + other_params, "batch")
    got = tokens(batch)
    assert [got[str(i)] for i in range(len(prompts))] == [want[str(i)] for i in range(len(prompts))]
    assert [got[str(len(prompts) + i)] for i in range(len(others))] == [want_others[str(i)] for i in range(2)]
    assert sum(batch[str(i)].num_draft_tokens for i in range(len(rep))) > 0  # their lookups match
