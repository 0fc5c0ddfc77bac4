"""The tensor-parallel engine path on the CPU (gloo): ranks agree with one rank, a dead or
failing worker stops the engine with a clear error within seconds, the engine can be
rebuilt in the same process, two "nodes" on localhost, and the control channel's cost.

Each family's TP = 1 equivalence is in tests/test_tp_<family>.py and the conformance
check CR-TP-01."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import hf_greedy
from tp_harness import free_port, run_ranks

from core_runner import LLM, SamplingParams
from core_runner.executor.errors import EngineDeadError
from core_runner.oracle import UnsupportedError
from core_runner.plugins import load_plugins

SMALL = dict(device="cpu", dtype="float32", num_kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=16,
             max_model_len=128, block_size=4)
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9] * 10, [11, 12]]


def _generate(llm: LLM, prompts=PROMPTS, params=GREEDY):
    steps = llm.engine.debug.record_steps()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], steps


def _max_logit_diff(a, b) -> float:
    assert [s.req_ids for s in a] == [s.req_ids for s in b]
    return max(float((x.logits[r] - y.logits[r]).abs().max()) for x, y in zip(a, b) for r in x.logits)


def test_tp2_equals_tp1_with_chunked_prefill_and_preemption(untied, single_torch_thread):
    one = LLM(untied.path, **SMALL)
    want, steps1 = _generate(one)
    two = LLM(untied.path, tensor_parallel_size=2, **SMALL)
    try:
        got, steps2 = _generate(two)
        assert got == want
        assert max(s.num_tokens for s in steps2) <= 16 and any(s.num_scheduled.get("1", 0) > 1 and
                                                                 s.num_computed.get("1", 0) > 0 for s in steps2)
        assert _max_logit_diff(steps1, steps2) < 1e-4
        # a forced preemption mid-decode recomputes the request on every rank
        e = two.engine
        rid = e.add_request(PROMPTS[1], GREEDY)
        while not any(s.num_computed.get(rid, 0) >= len(PROMPTS[1]) for s in steps2):
            e.step()
        e.debug.preempt(rid)
        outs = []
        while e.has_unfinished_requests():
            outs += e.step()
        assert outs[0].outputs[0].token_ids == want[1]
    finally:
        two.engine.shutdown()


def test_killed_worker_gives_a_clear_error_within_seconds(untied, single_torch_thread):
    llm = LLM(untied.path, tensor_parallel_size=2, **SMALL)
    pid = llm.engine.executor.workers.procs[1].pid
    calls = {"n": 0, "killed_at": None}

    def kill_at_third_step(_so):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(pid, signal.SIGKILL)
            calls["killed_at"] = time.monotonic()

    llm.engine.debug.before_step(kill_at_third_step)
    with pytest.raises(EngineDeadError, match=r"worker rank 1 \(pid \d+\) was killed by signal 9"):
        llm.generate([[1, 2, 3]] * 2, SamplingParams(max_tokens=30, temperature=0.0), use_tqdm=False)
    assert time.monotonic() - calls["killed_at"] < 10
    with pytest.raises(EngineDeadError, match="engine is stopped"):
        llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    assert llm.engine.debug.rows() == {}, "rank 0 kept rows of the failed requests"
    llm.engine.shutdown()
    # the process can hold a new tensor-parallel engine after the dead one is shut down
    again = LLM(untied.path, tensor_parallel_size=2, **SMALL)
    try:
        assert _generate(again, PROMPTS[:1])[0] == _generate(LLM(untied.path, **SMALL), PROMPTS[:1])[0]
    finally:
        again.engine.shutdown()


def _failing_pm(cls: str):
    pm = load_plugins()
    base = pm.registry.get("Qwen3ForCausalLM")
    pm.registry.add("Qwen3ForCausalLM", f"tp_fixtures:{cls}", base.model_state,
                    capabilities={"tensor_parallel": "supported", "chunked_prefill": "supported"}, override=True)
    return pm


def test_worker_failing_to_build_is_reported_with_its_error(untied, single_torch_thread):
    t0 = time.monotonic()
    with pytest.raises(EngineDeadError, match="rank 1.*RuntimeError: rank 1 cannot build this model"):
        LLM(untied.path, tensor_parallel_size=2, plugins=_failing_pm("FailsToBuildOnRank1"), **SMALL)
    assert time.monotonic() - t0 < 30


def test_worker_failing_mid_step_stops_the_engine_with_its_error(untied, single_torch_thread):
    llm = LLM(untied.path, tensor_parallel_size=2, plugins=_failing_pm("FailsAtPosition12OnRank1"), **SMALL)
    try:
        t0 = time.monotonic()
        with pytest.raises(EngineDeadError, match="rank 1.*exited with code 1.*rank 1 fails at position 12"):
            llm.generate([[1, 2, 3]], SamplingParams(max_tokens=20, temperature=0.0), use_tqdm=False)
        assert time.monotonic() - t0 < 15
    finally:
        llm.engine.shutdown()


def test_undeclared_family_and_bad_sizes_are_refused_by_name(untied, tmp_path):
    pm = load_plugins()
    base = pm.registry.get("Qwen3ForCausalLM")
    pm.registry.add("Qwen3ForCausalLM", base.model, base.model_state, capabilities={}, override=True)
    with pytest.raises(UnsupportedError, match="tensor_parallel_size=2 needs the tensor_parallel capability"):
        LLM(untied.path, tensor_parallel_size=2, plugins=pm, **SMALL)
    with pytest.raises(UnsupportedError, match="enable_expert_parallel=True needs the expert_parallel capability"):
        LLM(untied.path, tensor_parallel_size=2, enable_expert_parallel=True, **SMALL)
    with pytest.raises(ValueError, match="num_attention_heads=4 is not divisible by tensor_parallel_size=3"):
        LLM(untied.path, tensor_parallel_size=3, **SMALL)


def test_two_nodes_on_localhost(untied, single_torch_thread):
    """Node 1 runs `core-runner serve --headless`; node 0's engine drives both."""
    port = free_port()
    node1 = subprocess.Popen(
        [sys.executable, "-m", "core_runner.cli", "serve", "--headless", "--tensor-parallel-size", "2", "--nnodes",
         "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), "--device", "cpu"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        llm = LLM(untied.path, tensor_parallel_size=2, nnodes=2, master_port=port, **SMALL)
        try:
            got = _generate(llm)[0]
        finally:
            llm.engine.shutdown()
        assert node1.wait(timeout=30) == 0, node1.stdout.read().decode()[-2000:]
        assert got == _generate(LLM(untied.path, **SMALL))[0]
    finally:
        if node1.poll() is None:
            node1.kill()


GUARDLESS_SCRIPT = """\
import json
import sys

from core_runner import LLM, SamplingParams

print("script body runs", flush=True)
llm = LLM(sys.argv[1], tensor_parallel_size=2, **json.loads(sys.argv[2]))
outs = llm.generate(json.loads(sys.argv[3]), SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)
print("TOKENS " + json.dumps([o.outputs[0].token_ids for o in outs]), flush=True)
"""


def test_script_without_main_guard_runs_tensor_parallel(untied, tmp_path):
    """A plain script (no ``if __name__ == "__main__":``) builds a TP=2 engine: the workers
    never re-run it, so its body runs once and the output is one rank's greedy tokens."""
    import json

    script = tmp_path / "plain_script.py"
    script.write_text(GUARDLESS_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(script), untied.path, json.dumps(SMALL), json.dumps(PROMPTS)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("script body runs") == 1, run.stdout
    got = json.loads(run.stdout.split("TOKENS ", 1)[1])
    assert got == [hf_greedy(untied, p, 8) for p in PROMPTS]


def _channel_costs() -> tuple[float, float]:
    return _channel_cost(256, 0, 0, 50), _channel_cost(0, 64, 1000, 10)


def _channel_cost(n_decode: int, n_new: int, prompt_len: int, repeats: int) -> float:
    from core_runner.distributed import get_tp_group
    from core_runner.executor.control import ControlChannel
    from core_runner.sampling_params import SamplingParams
    from core_runner.step_data.scheduler_output import NewRequest, SchedulerOutput

    group = get_tp_group()
    channel = ControlChannel(group.cpu_group, group.rank)
    new = [NewRequest(req_id=f"n{i}", token_ids=list(range(prompt_len)), num_prompt_tokens=prompt_len,
                      sampling_params=SamplingParams(), seed=i, block_ids=list(range(prompt_len // 16)))
           for i in range(n_new)]
    so = SchedulerOutput(num_scheduled_tokens={f"d{i}": 1 for i in range(n_decode)}, new_reqs=new)
    t0 = time.perf_counter()
    for _ in range(repeats):
        if group.rank == 0:
            channel.send(("execute_model", (so, False)))
        else:
            got = channel.recv()
            assert got[1][0].num_scheduled_tokens == so.num_scheduled_tokens and len(got[1][0].new_reqs) == n_new
    return (time.perf_counter() - t0) / repeats


def test_control_broadcast_cost():
    """The per-step cost of sending a SchedulerOutput to the workers (figures in
    core_runner/executor/control.py)."""
    decode, prefill = run_ranks(_channel_costs, 2)[0]
    print(f"control broadcast, 2 ranks: decode step of 256 requests {decode * 1e3:.2f} ms, "
          f"64 new 1,000-token prompts {prefill * 1e3:.2f} ms")
    assert decode < 0.02 and prefill < 0.2
