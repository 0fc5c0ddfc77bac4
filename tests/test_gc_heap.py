"""The cycle collector is kept off the engine's loops (core_runner/executor/gc_heap.py): paused
inside offline LLM calls and restored after them, frozen after start-up in processes the
engine owns."""
from __future__ import annotations

import gc

import pytest

from core_runner import LLM, SamplingParams
from core_runner.executor.gc_heap import freeze_gc_heap, paused_gc


@pytest.fixture
def gc_restored():
    was = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if was else gc.disable)()


def test_paused_gc_nests_and_restores_the_state_it_found(gc_restored):
    gc.enable()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner exit is not the last
    assert gc.isenabled()
    gc.disable()
    with paused_gc():
        pass
    assert not gc.isenabled()  # a collector the caller had switched off stays off


def test_paused_gc_restores_after_an_exception(gc_restored):
    gc.enable()
    with pytest.raises(RuntimeError):
        with paused_gc():
            raise RuntimeError("boom")
    assert gc.isenabled()


def test_freeze_collects_garbage_before_freezing(gc_restored):
    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle, garbage once the names go
    del a, b
    count = freeze_gc_heap()
    assert count == gc.get_freeze_count() > 0
    assert not any(type(o) is Node for o in gc.get_objects())  # collected, not frozen for good


def test_offline_calls_step_the_engine_with_the_collector_paused(untied, gc_restored):
    llm = LLM(untied.path, device="cpu", dtype="float32", max_model_len=64, max_num_seqs=4, num_kv_blocks=32,
              block_size=8)
    seen = []
    llm.engine.debug.before_step(lambda out: seen.append(gc.isenabled()))
    gc.enable()
    llm.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=3, temperature=0.0), use_tqdm=False)
    assert seen and not any(seen)
    assert gc.isenabled()
