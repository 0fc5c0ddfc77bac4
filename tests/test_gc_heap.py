"""The cycle collector is kept off the engine's loops (core_runner/executor/gc_heap.py): paused
inside offline LLM calls and restored after them, frozen after start-up in processes the
engine owns; staged host tables built through arrays, exactly as torch.tensor builds them."""
from __future__ import annotations

import gc

import pytest
import torch

from core_runner import LLM, SamplingParams
from core_runner.executor.gc_heap import freeze_gc_heap, paused_gc
from core_runner.step_data.buffers import StagedWriteTensor


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


@pytest.mark.parametrize("dtype,values", [
    (torch.int32, [0, -5, 2**31 - 1, 7]),
    (torch.int64, [2**40, -3, 0]),
    (torch.float32, [0.5, -1e-30, float("inf"), 3.25]),
    (torch.float64, [1e300, -0.0, 2.5]),
])
def test_staged_writes_land_bit_exact(dtype, values):
    t = StagedWriteTensor((2, 4), dtype, "cpu")
    t.stage_write(1, 0, values)
    t.apply_staged_writes()
    want = torch.zeros((2, 4), dtype=dtype)
    want[1, :len(values)] = torch.tensor(values, dtype=dtype)
    assert torch.equal(t.gpu, want)
    assert t.gpu[1, 1].item() == torch.tensor(values[1], dtype=dtype).item()


def test_values_an_array_refuses_go_through_torch():
    t = StagedWriteTensor((3,), torch.float32, "cpu")
    t.stage_scalar(0, 1)  # an int in a float table: an array('f') takes it, torch would too
    t.stage_scalar(2, True)
    t.apply_staged_writes()
    assert t.gpu.tolist() == [1.0, 0.0, 1.0]
    ints = StagedWriteTensor((2,), torch.int64, "cpu")
    ints.stage_scalar(1, 2**63)  # past int64: the error torch.tensor raised before
    with pytest.raises((RuntimeError, ValueError, OverflowError), match="[Oo]verflow"):
        ints.apply_staged_writes()
    assert not ints.has_staged
