"""A fault inside a step never wedges the engine: the step's requests finish with "error",
their rows and blocks are freed, and requests added afterwards run as if nothing happened."""
from __future__ import annotations

import importlib
import logging

import pytest
from helpers import cdiv, greedy, hf_greedy, random_prompts

from core_runner import LLM
from core_runner.plugins import PluginManager
from core_runner.step_data.buffers import StagedWriteTensor

pytest.importorskip("core_runner_qwen3")


@pytest.fixture()
def faulty(untied):
    """(engine, FaultyForward): an engine over the untied checkpoint whose forward raises on
    the calls listed in FaultyForward.fail_on."""
    module = importlib.import_module("conformance_fixtures.faulty_forward")
    cls = module.FaultyForward
    pm = PluginManager()
    pm.register_module("faulty_forward", module)

    def build(**opts):
        cls.calls, cls.fail_on, cls.nan_on, cls.error = 0, set(), set(), RuntimeError
        o = dict(dtype="float32", device="cpu", max_model_len=64, max_num_seqs=4, block_size=4)
        o.update(opts)
        o["num_kv_blocks"] = o["max_num_seqs"] * cdiv(o["max_model_len"], o["block_size"])
        return LLM(untied.path, plugins=pm, **o).engine, cls

    yield build
    cls.fail_on, cls.nan_on, cls.error = set(), set(), RuntimeError


def _assert_clean(engine, flush: bool = True) -> None:
    """No row, block or request is left. A request that finished normally keeps its row
    until the next step removes it (``flush`` runs that step); a failed one has none."""
    if flush:
        engine.step()
    assert engine.debug.rows() == {}
    assert engine.debug.num_free_blocks == engine.num_blocks
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_forward_fault_finishes_the_step_with_error_and_the_engine_goes_on(
        faulty, untied, async_scheduling, caplog):
    engine, cls = faulty(async_scheduling=async_scheduling)
    prompts = random_prompts([5, 9, 7], seed=3)
    for i, p in enumerate(prompts):
        engine.add_request(p, greedy(6), req_id=f"r{i}")
    cls.fail_on = {3}  # a decode step: every request is running, one step may be in flight
    outs = {}
    with caplog.at_level(logging.ERROR, logger="core_runner.engine.engine_core"):
        for _ in range(50):
            if not engine.has_unfinished_requests():
                break
            for o in engine.step():
                assert o.req_id not in outs
                outs[o.req_id] = o
    assert set(outs) == {"r0", "r1", "r2"}
    assert {o.finish_reason for o in outs.values()} == {"error"}
    assert "planted fault in forward call 3" in caplog.text and "r0" in caplog.text
    _assert_clean(engine, flush=False)
    # the rows, blocks and staged tables are reusable: a new request gives the reference output
    after = random_prompts([6, 11], seed=4)
    for i, p in enumerate(after):
        engine.add_request(p, greedy(8), req_id=f"after{i}")
    outs = {}
    while engine.has_unfinished_requests():
        outs.update({o.req_id: o for o in engine.step()})
    for i, p in enumerate(after):
        assert outs[f"after{i}"].finish_reason == "length"
        assert outs[f"after{i}"].token_ids == hf_greedy(untied, p, 8)
    _assert_clean(engine)


def test_only_the_failed_steps_requests_fail(faulty, untied):
    """A request waiting for a row when the fault happens is not touched by it."""
    engine, cls = faulty(max_num_seqs=1, async_scheduling=False)
    p0, p1 = random_prompts([5, 6], seed=5)
    engine.add_request(p0, greedy(4), req_id="first")
    engine.add_request(p1, greedy(4), req_id="second")
    cls.fail_on = {2}
    outs = {}
    while engine.has_unfinished_requests():
        outs.update({o.req_id: o for o in engine.step()})
    assert outs["first"].finish_reason == "error"
    assert outs["second"].finish_reason == "length"
    assert outs["second"].token_ids == hf_greedy(untied, p1, 4)
    _assert_clean(engine)


def test_generate_returns_error_outputs_instead_of_hanging(faulty, untied):
    engine, cls = faulty()
    llm = LLM.__new__(LLM)
    llm.config, llm.engine = engine.config, engine
    prompts = random_prompts([5, 8], seed=6)
    cls.fail_on = {1}
    outs = llm.generate(prompts, greedy(5))
    assert [o.finish_reason for o in outs] == ["error", "error"]
    outs = llm.generate(prompts, greedy(5))
    assert [o.token_ids for o in outs] == [hf_greedy(untied, p, 5) for p in prompts]
    _assert_clean(engine)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_keyboard_interrupt_cleans_up_then_propagates(faulty, untied, async_scheduling):
    engine, cls = faulty(async_scheduling=async_scheduling)
    llm = LLM.__new__(LLM)
    llm.config, llm.engine = engine.config, engine
    prompts = random_prompts([5, 8, 4], seed=7)
    cls.fail_on, cls.error = {3}, KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts, greedy(6))
    _assert_clean(engine)
    cls.fail_on = set()
    outs = llm.generate(prompts, greedy(6))
    assert [o.token_ids for o in outs] == [hf_greedy(untied, p, 6) for p in prompts]


def test_a_staged_write_that_fails_does_not_poison_later_writes():
    t = StagedWriteTensor((4,), __import__("torch").int32, "cpu")
    t.stage_scalar(1, 2**31)  # does not fit int32
    with pytest.raises(RuntimeError, match="overflow"):
        t.apply_staged_writes()
    assert not t.has_staged
    t.stage_scalar(2, 7)
    t.apply_staged_writes()
    assert t.gpu.tolist() == [0, 0, 7, 0]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_nan_logits_finish_the_request_with_error_not_token_0(faulty, untied, async_scheduling, caplog):
    engine, cls = faulty(async_scheduling=async_scheduling)
    prompts = random_prompts([5, 9], seed=8)
    for i, p in enumerate(prompts):
        engine.add_request(p, greedy(6), req_id=f"n{i}")
    cls.nan_on = {3}  # the second decode step: two good tokens first
    outs = {}
    with caplog.at_level(logging.ERROR, logger="core_runner.engine.scheduler"):
        while engine.has_unfinished_requests():
            outs.update({o.req_id: o for o in engine.step()})
    for i, p in enumerate(prompts):
        assert outs[f"n{i}"].finish_reason == "error"
        assert outs[f"n{i}"].token_ids == hf_greedy(untied, p, 2)
    assert "non-finite logits" in caplog.text and "n0" in caplog.text
    _assert_clean(engine)
    engine.add_request(prompts[0], greedy(6), req_id="later")
    outs = {}
    while engine.has_unfinished_requests():
        outs.update({o.req_id: o for o in engine.step()})
    assert outs["later"].token_ids == hf_greedy(untied, prompts[0], 6)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_ctrl_c_after_scheduling_loses_nothing(faulty, untied, async_scheduling):
    """The worst moment: schedule() has admitted requests and handed over the removals,
    and its SchedulerOutput is lost. Every running request fails, no row or block leaks."""
    engine, cls = faulty(async_scheduling=async_scheduling, max_num_seqs=2)
    prompts = random_prompts([5, 9, 6], seed=9)
    engine.add_request(prompts[0], greedy(2), req_id="short")
    engine.add_request(prompts[1], greedy(8), req_id="long")
    engine.add_request(prompts[2], greedy(4), req_id="waiting")
    schedule = engine.scheduler.schedule
    outs = {}
    while "short" not in outs:
        outs.update({o.req_id: o for o in engine.step()})

    def interrupted():
        schedule()
        raise KeyboardInterrupt

    engine.scheduler.schedule = interrupted
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    engine.scheduler.schedule = schedule
    assert engine.debug.rows() == {}
    assert not engine.scheduler.running
    while engine.has_unfinished_requests():
        outs.update({o.req_id: o for o in engine.step()})
    assert outs["short"].token_ids == hf_greedy(untied, prompts[0], 2)
    assert outs["waiting"].token_ids == hf_greedy(untied, prompts[2], 4) or outs["waiting"].finish_reason == "error"
    _assert_clean(engine)
