"""LLM.generate from several threads, and beside requests added at the engine level."""
from __future__ import annotations

import threading

import pytest
from helpers import cdiv, greedy, hf_greedy, random_prompts

from core_runner import LLM


def _llm(ckpt, **opts) -> LLM:
    o = dict(dtype="float32", device="cpu", max_model_len=64, max_num_seqs=4, block_size=4)
    o.update(opts)
    o["num_kv_blocks"] = o["max_num_seqs"] * cdiv(o["max_model_len"], o["block_size"])
    return LLM(ckpt.path, **o)


def test_generate_from_two_threads_gives_each_its_own_complete_outputs(untied):
    llm = _llm(untied)
    batches = [random_prompts([5, 7, 6], seed=10), random_prompts([8, 4], seed=11)]
    results: dict[int, list] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(batches))

    def call(i: int) -> None:
        try:
            start.wait()
            for _ in range(3):
                results.setdefault(i, []).append(llm.generate(batches[i], greedy(6)))
        except BaseException as e:  # reported below, with the thread's index
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a generate() call hung"
    assert not errors, errors
    for i, prompts in enumerate(batches):
        want = [hf_greedy(untied, p, 6) for p in prompts]
        for outs in results[i]:
            assert [o.token_ids for o in outs] == want
    llm.engine.step()  # removes the rows of the last finished requests
    assert llm.engine.debug.rows() == {}
    assert llm.engine.debug.num_free_blocks == llm.engine.num_blocks


def test_generate_keeps_the_outputs_of_requests_added_at_the_engine_level(untied):
    llm = _llm(untied)
    mine, theirs = random_prompts([5, 9], seed=12)
    engine = llm.engine
    engine.add_request(theirs, greedy(3), req_id="theirs")
    outs = llm.generate([mine], greedy(10))
    assert [o.token_ids for o in outs] == [hf_greedy(untied, mine, 10)]
    # "theirs" finished during generate(): its output waits for its owner's step()
    assert engine.has_unfinished_requests()
    got = {}
    while engine.has_unfinished_requests():
        got.update({o.req_id: o for o in engine.step()})
    assert set(got) == {"theirs"}
    assert got["theirs"].token_ids == hf_greedy(untied, theirs, 3)


def test_generate_does_not_wait_for_other_requests(untied):
    """A longer request added at the engine level keeps running after generate() returns."""
    llm = _llm(untied)
    mine, theirs = random_prompts([5, 9], seed=13)
    llm.engine.add_request(theirs, greedy(16), req_id="theirs")
    outs = llm.generate([mine], greedy(2))
    assert outs[0].token_ids == hf_greedy(untied, mine, 2)
    assert "theirs" in llm.engine.scheduler.requests
    got = {}
    while llm.engine.has_unfinished_requests():
        got.update({o.req_id: o for o in llm.engine.step()})
    assert got["theirs"].token_ids == hf_greedy(untied, theirs, 16)


def test_an_id_clash_in_generate_does_not_abort_the_other_request(untied):
    llm = _llm(untied)
    mine, theirs = random_prompts([5, 9], seed=14)
    nxt = str(next(llm.engine.input_processor._ids) + 1)  # the id generate's second prompt will get
    llm.engine.add_request(theirs, greedy(3), req_id=nxt)
    with pytest.raises(ValueError, match=f"request id '{nxt}' is already in use"):
        llm.generate([mine, mine], greedy(3))
    got = {}
    while llm.engine.has_unfinished_requests():
        got.update({o.req_id: o for o in llm.engine.step()})
    assert set(got) == {nxt}
    assert got[nxt].token_ids == hf_greedy(untied, theirs, 3)
