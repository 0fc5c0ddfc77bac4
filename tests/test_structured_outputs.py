"""Structured outputs on the demo model (trained Qwen3, 2k BPE): outputs parse and validate
against the constraint, with and without async scheduling; a request without a grammar gets
the same tokens in a batch with grammar requests as alone; preemption replays the matcher;
bad constraints are refused by name."""
from __future__ import annotations

import json

import pytest

from core_runner import LLM, SamplingParams
from core_runner.demo import demo_checkpoint
from core_runner.structured_outputs import StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
                   "size": {"enum": ["s", "m", "l"]}},
    "required": ["name", "ok", "size"],
}


@pytest.fixture(scope="module", params=[True, False], ids=["async", "sync"])
def llm(request):
    return LLM(demo_checkpoint(), device="cpu", dtype="float32", max_model_len=192, max_num_seqs=8,
               num_kv_blocks=96, async_scheduling=request.param)


def _validate(v: object) -> None:
    """SCHEMA's rules, checked by hand (jsonschema is not a dependency)."""
    assert isinstance(v, dict) and set(v) == {"name", "ok", "size"}, v
    assert isinstance(v["name"], str) and len(v["name"]) <= 6 and isinstance(v["ok"], bool)
    assert v["size"] in ("s", "m", "l")


def _json(seed: int) -> SamplingParams:
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    return SamplingParams(max_tokens=80, temperature=0.9, seed=seed, structured_outputs=so)


def test_outputs_follow_their_constraints_and_plain_rows_are_unaffected(llm):
    plain = SamplingParams(max_tokens=10, temperature=0.0)
    params = [_json(s) for s in range(3)] + [
        SamplingParams(max_tokens=8, temperature=1.0, seed=3, structured_outputs={"choice": ["red", "green"]}),
        SamplingParams(max_tokens=12, temperature=1.0, seed=4, structured_outputs={"regex": r"[a-c]{3}-[0-9]{2}"}),
        SamplingParams(max_tokens=40, temperature=0.8, seed=5, structured_outputs={"json_object": True,
                                                                                     "disable_any_whitespace": True}),
        plain,
    ]
    outs = llm.generate(["The cat", "A", "Once", "Pick", "Code", "Say", "The dog"], params, use_tqdm=False)
    for o in outs[:3]:
        assert o.outputs[0].finish_reason == "stop"
        _validate(json.loads(o.outputs[0].text))
    assert outs[3].outputs[0].text in ("red", "green")
    import re
    assert re.fullmatch(r"[a-c]{3}-[0-9]{2}", outs[4].outputs[0].text)
    if outs[5].outputs[0].finish_reason == "stop":
        assert isinstance(json.loads(outs[5].outputs[0].text), dict)
    else:
        assert outs[5].outputs[0].text.startswith("{")
    alone = llm.generate(["The dog"], [plain], use_tqdm=False)[0]
    assert alone.outputs[0].token_ids == outs[-1].outputs[0].token_ids


def test_preempted_grammar_request_replays_its_matcher(llm, request):
    if "async" in request.node.name:
        pytest.skip("a request of an async engine always has a token in flight: preempted in the sync engine")
    eng = llm.engine
    ref = llm.generate(["The cat"], [_json(11)], use_tqdm=False)[0].outputs[0].token_ids
    eng.add_request("The cat", _json(11), req_id="p")
    done, preempted = [], False
    while eng.has_unfinished_requests():
        if not preempted and "p" in eng.debug.preemptible() and len(eng.scheduler.requests["p"].output_token_ids) > 4:
            eng.debug.preempt("p")
            preempted = True
        done += [o for o in eng.step() if o.finished]
    assert preempted and done[0].outputs[0].token_ids == ref


@pytest.mark.parametrize("so, match", [
    ({"json": {"type": "string", "format": "no-such-format-xyz", "pattern": "(?<=a)b"}}, "xgrammar"),
    ({"grammar": "root ::= undefined_rule"}, "xgrammar"),
])
def test_bad_constraints_are_refused_by_name(llm, so, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(["x"], SamplingParams(max_tokens=4, structured_outputs=so), use_tqdm=False)


def test_params_refuse_zero_or_two_constraints():
    with pytest.raises(ValueError, match="exactly one of"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="regex, choice are set"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="unknown field"):
        SamplingParams(structured_outputs={"jsn": {}})


def test_batch_fill_writes_the_masks_one_by_one_fill_writes(llm):
    """The grammar stage fills plain decode masks in one xgrammar batch call: each row equals
    the request's own ``fill`` at the same matcher state, untouched rows stay as they were."""
    import torch

    from core_runner.structured_outputs.manager import BatchFill

    eng = llm.engine
    tok = eng.tokenizer
    specs = [StructuredOutputsParams(json=SCHEMA), StructuredOutputsParams(regex="[0-9]{2,4}x"),
             StructuredOutputsParams(choice=["left", "right"]), StructuredOutputsParams(json_object=True)]
    grammars = [eng.input_processor.structured_outputs().request(s, tuple(eng.eos_token_ids)) for s in specs]
    for g in grammars:
        g.future.result()
    grammars[0].sync(tok.encode('{"name"', add_special_tokens=False))  # one matcher moved off its start
    words = -(-eng.vocab_size // 32)
    one = torch.zeros((6, words), dtype=torch.int32)
    for g, row in zip(grammars, (0, 2, 3, 5)):
        assert g.fill(one, row)
    batched = torch.full((6, words), 7, dtype=torch.int32)
    BatchFill()(grammars, batched, [0, 2, 3, 5])
    assert torch.equal(batched[[0, 2, 3, 5]], one[[0, 2, 3, 5]])
    assert bool((batched[[1, 4]] == 7).all())
    assert not torch.equal(one[0], one[5])  # the rows really differ
