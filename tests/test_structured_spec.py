"""Structured outputs under n-gram speculative decoding, on the demo model (trained Qwen3,
2k BPE), with and without async scheduling: outputs validate against their constraint;
greedy and seeded tokens equal those of the same grammar without speculation, with
proposals kept; a request without a grammar gets the same tokens beside grammar requests
as without them; a proposal that completes the grammar ends the output there; a request
preempted while speculating replays its matcher; TP = 2 gives the TP = 1 tokens."""
from __future__ import annotations

import json
import re

import pytest

from core_runner import LLM, SamplingParams
from core_runner.demo import demo_checkpoint
from core_runner.structured_outputs import StructuredOutputsParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
                   "size": {"enum": ["s", "m", "l"]}},
    "required": ["name", "ok", "size"],
}
REGEX = r"(ab|cd){2,6}x"
CHOICES = ["red", "green", "red red red"]
# repetitive prompts, so that the n-gram proposer finds matches
PROMPTS = ["The cat the cat the cat", "abab cdcd abab", "red red red red", "The dog the dog the dog"]


def _engine(spec: bool, async_scheduling: bool) -> LLM:
    kw = {"speculative_config": NGRAM} if spec else {}
    return LLM(demo_checkpoint(), device="cpu", dtype="float32", max_model_len=192, max_num_seqs=8,
               num_kv_blocks=96, async_scheduling=async_scheduling, **kw)


@pytest.fixture(scope="module", params=[True, False], ids=["async", "sync"])
def engines(request):
    return _engine(True, request.param), _engine(False, request.param)


def _constrained(temperature: float = 0.0, seed: int | None = None) -> list[SamplingParams]:
    kw = dict(temperature=temperature, seed=seed)
    compact = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    return [
        SamplingParams(max_tokens=60, structured_outputs=compact, **kw),
        SamplingParams(max_tokens=40, structured_outputs={"regex": REGEX}, **kw),
        SamplingParams(max_tokens=10, structured_outputs={"choice": CHOICES}, **kw),
    ]


def _check(outs) -> None:
    v = json.loads(outs[0].outputs[0].text)
    assert set(v) == {"name", "ok", "size"} and isinstance(v["ok"], bool) and v["size"] in ("s", "m", "l"), v
    assert isinstance(v["name"], str) and len(v["name"]) <= 6
    assert re.fullmatch(REGEX, outs[1].outputs[0].text)
    assert outs[2].outputs[0].text in CHOICES
    assert all(o.outputs[0].finish_reason == "stop" for o in outs)


def _tokens(outs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("temperature, seed", [(0.0, None), (0.9, 7)], ids=["greedy", "seeded"])
def test_outputs_validate_and_equal_those_without_speculation(engines, temperature, seed):
    spec, plain = engines
    params = _constrained(temperature, seed)
    got = spec.generate(PROMPTS[:3], params, use_tqdm=False)
    _check(got)
    assert _tokens(got) == _tokens(plain.generate(PROMPTS[:3], params, use_tqdm=False))
    # speculation ran on the grammar requests and kept proposals through their masks
    assert all(o.num_draft_tokens > 0 for o in got) and sum(o.num_accepted_tokens for o in got) > 0


def test_plain_requests_beside_grammar_requests_are_unaffected(engines):
    spec, _ = engines
    plain = [SamplingParams(max_tokens=24, temperature=0.0), SamplingParams(max_tokens=24, temperature=1.0, seed=3)]
    mixed = spec.generate(PROMPTS[:3] + PROMPTS[2:4], _constrained() + plain, use_tqdm=False)
    _check(mixed[:3])
    alone = spec.generate(PROMPTS[2:4], plain, use_tqdm=False)
    assert _tokens(mixed[3:]) == _tokens(alone)
    assert sum(o.num_accepted_tokens for o in mixed[3:]) > 0


def test_a_proposal_completing_the_grammar_ends_the_output(engines):
    # the prompt holds the grammar's whole answer, EOS (id 0) included, so n-gram proposes
    # EOS and then more; with ignore_eos only the completed grammar stops the request, and
    # nothing sampled after the completing proposal may be kept
    spec, plain = engines
    answer = [85, 72, 71, 224, 409, 224, 409, 0]  # "red red red" and EOS, as the demo model spells it greedily
    prompts = [{"prompt_token_ids": answer * 2 + answer[:j]} for j in (1, 2)]
    sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, structured_outputs={"choice": CHOICES})
    want = _tokens(plain.generate(prompts, sp, use_tqdm=False))
    got = spec.generate(prompts, sp, use_tqdm=False)
    assert want == [answer, answer] and _tokens(got) == want
    assert all(o.outputs[0].finish_reason == "stop" and o.num_accepted_tokens > 0 for o in got)


def test_preempted_while_speculating_replays_the_matcher(engines, request):
    if "async" in request.node.name:
        pytest.skip("a request of an async engine always has a token in flight: preempted in the sync engine")
    spec, _ = engines
    params = _constrained()[0]
    ref = spec.generate([PROMPTS[0]], [params], use_tqdm=False)[0].outputs[0].token_ids
    eng = spec.engine
    eng.add_request(PROMPTS[0], params, req_id="p")
    done, preempted = [], False
    while eng.has_unfinished_requests():
        req = eng.scheduler.requests.get("p")
        if not preempted and req is not None and req.num_accepted_tokens > 0 and "p" in eng.debug.preemptible():
            eng.debug.preempt("p")
            preempted = True
        done += [o for o in eng.step() if o.finished]
    assert preempted and list(done[0].outputs[0].token_ids) == list(ref)
    assert done[0].num_preemptions == 1


def test_tensor_parallel_with_grammars_and_speculation(engines, request, single_torch_thread):
    # only rank 0 holds grammars; its acceptance cap (the completing proposal of the last
    # prompt sets one) is broadcast with the sampled tokens
    if "async" in request.node.name:
        pytest.skip("one tensor-parallel run is enough (the cap broadcast is the same in both pipelines)")
    spec, _ = engines
    answer = [85, 72, 71, 224, 409, 224, 409, 0]
    prompts = PROMPTS[:3] + [{"prompt_token_ids": answer * 2 + answer[:1]}]
    params = _constrained() + [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True,
                                              structured_outputs={"choice": CHOICES})]
    want = spec.generate(prompts, params, use_tqdm=False)
    tp = LLM(demo_checkpoint(), tensor_parallel_size=2, speculative_config=NGRAM, device="cpu", dtype="float32",
             max_model_len=192, max_num_seqs=8, num_kv_blocks=96, async_scheduling=False)
    try:
        got = tp.generate(prompts, params, use_tqdm=False)
    finally:
        tp.engine.shutdown()
    _check(got[:3])
    assert _tokens(got) == _tokens(want) and sum(o.num_accepted_tokens for o in got) > 0
