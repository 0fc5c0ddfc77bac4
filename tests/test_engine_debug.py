"""engine.debug, the inspection and fault-injection API the tests and the conformance
suite observe an engine through (core_runner/engine/debug.py)."""
from __future__ import annotations

import pytest
import torch
from helpers import drain, greedy, hf_greedy, hf_logits, make_engine, random_prompts, run, step_until

N_NEW = 8


def test_record_steps_logits_equal_a_second_engine(untied):
    prompts = random_prompts([7, 13, 2], seed=3)
    reqs = [(f"r{i}", p, greedy(N_NEW)) for i, p in enumerate(prompts)]

    e = make_engine(untied, max_num_batched_tokens=8)
    steps = e.debug.record_steps()
    assert steps is e.debug.record_steps(), "record_steps returns the one live list"
    outs = run(e, reqs)

    # the second engine's logits straight from the hook, in batch order
    other = make_engine(untied, max_num_batched_tokens=8)
    raw: list[tuple[list[str], torch.Tensor]] = []
    other.debug.on_logits(lambda ids, lg: raw.append((list(ids), lg.float().cpu().clone())))
    other_outs = run(other, reqs)

    assert len(steps) == len(raw) > 0
    for k, (s, (ids, lg)) in enumerate(zip(steps, raw)):
        assert s.req_ids == ids, k
        assert sorted(s.num_scheduled) == sorted(ids) and set(s.num_computed) == set(ids)
        assert set(s.rows) == set(ids) and len(set(s.rows.values())) == len(ids)
        assert s.num_tokens == sum(s.num_scheduled.values()) <= 8
        for i, rid in enumerate(ids):
            assert s.logits[rid].dtype == torch.float32 and s.logits[rid].device.type == "cpu"
            assert tuple(s.logits[rid].shape) == (e.vocab_size,)
            assert torch.equal(s.logits[rid], lg[i]), f"step {k} {rid}"
    assert steps[0].new_req_ids == ["r0", "r1"]  # r2 waits for the token budget
    assert "r2" in {r for s in steps for r in s.new_req_ids}
    for rid, o in outs.items():
        assert o.token_ids == other_outs[rid].token_ids == hf_greedy(untied, prompts[int(rid[1:])], N_NEW)
    # and the recorded logits are the model's: the last step of r0 against transformers
    last = next(s for s in reversed(steps) if "r0" in s.logits)
    pos = last.num_computed["r0"] + last.num_scheduled["r0"] - 1
    seq = list(outs["r0"].prompt_token_ids) + list(outs["r0"].token_ids)
    assert (last.logits["r0"] - hf_logits(untied, seq[:-1])[pos]).abs().max().item() <= 1e-4


def test_forced_preemption_recomputes_and_keeps_greedy_tokens(untied):
    a, b = random_prompts([11, 5], seed=7)
    e = make_engine(untied)
    steps = e.debug.record_steps()
    e.add_request(a, greedy(N_NEW), req_id="A")
    e.add_request(b, greedy(N_NEW), req_id="B")
    with pytest.raises(ValueError, match="cannot preempt"):
        e.debug.preempt("A")  # still waiting: not running
    outs: dict = {}
    req = e.scheduler.requests["A"]
    step_until(e, outs, lambda: len(req.output_token_ids) >= 3 and "A" in e.debug.preemptible())
    free_before = e.debug.num_free_blocks
    e.debug.preempt("A")
    assert e.debug.num_preemptions == 1
    assert "A" not in e.debug.preemptible()
    assert e.debug.num_free_blocks > free_before, "the preempted request's blocks were not freed"
    with pytest.raises(ValueError):
        e.debug.preempt("A")  # already preempted
    n_before = len(steps)
    drain(e, outs)

    after = steps[n_before:]
    assert "A" in after[0].preempted, "the runner must hear of the preemption in the next step"
    back = next(s for s in after if "A" in s.new_req_ids)
    # it resumes from its own blocks kept in the prefix cache: every full block before its
    # last known token (11 prompt + 3 or more generated tokens, blocks of 4)
    assert back.num_computed["A"] == 4 * ((back.num_computed["A"] + back.num_scheduled["A"] - 1) // 4) > 0
    assert back.num_computed["A"] + back.num_scheduled["A"] <= len(a) + len(req.output_token_ids)
    assert outs["A"].num_preemptions == 1 and outs["B"].num_preemptions == 0
    assert outs["A"].token_ids == hf_greedy(untied, a, N_NEW)
    assert outs["B"].token_ids == hf_greedy(untied, b, N_NEW)
    assert e.debug.num_free_blocks == e.num_blocks


def test_graph_replays_and_dummy_runs_on_cpu(untied):
    e = make_engine(untied)
    assert e.debug.graph_replays == 0
    base = e.debug.num_dummy_runs
    e.dummy_run(2, 5)
    e.dummy_run(1, 1)
    assert e.debug.num_dummy_runs == base + 2
    run(e, [("x", random_prompts([6], seed=1)[0], greedy(4))])
    assert e.debug.graph_replays == 0, "the CPU runs eager: no CUDA graph exists to replay"
    assert e.debug.num_dummy_runs == base + 2, "real steps are not dummy runs"


def test_memory_probe_sizes_the_kv_pool(untied):
    from core_runner import LLM

    opts = {"dtype": "float32", "max_model_len": 128, "max_num_seqs": 8, "block_size": 4}
    rep = make_engine(untied, **opts).memory_report()
    block_bytes = rep["kv_bytes_per_token"] * 4
    row_bytes = rep["state_bytes_per_row"] * (8 + 1)
    seen: list[torch.device] = []

    def probe(blocks: int):
        def free(device: torch.device) -> int:
            seen.append(device)
            return 2 * (blocks * block_bytes + row_bytes)  # fraction 0.5 leaves exactly `blocks`
        return free

    sizes = [LLM(untied.path, memory_probe=probe(n), num_kv_blocks=None, kv_cache_memory_fraction=0.5,
                 **opts).engine.num_blocks for n in (40, 60)]
    assert sizes == [40, 60]
    assert seen == [torch.device("cpu")] * 2
    e = LLM(untied.path, memory_probe=probe(40), num_kv_blocks=50, **opts).engine
    assert e.num_blocks == 50 and len(seen) == 2, "a given num_kv_blocks never asks the probe"
    assert all(t.shape[1] == 40 for t in LLM(untied.path, memory_probe=probe(40), num_kv_blocks=None,
                                              kv_cache_memory_fraction=0.5, **opts).engine.debug
               .paged_caches().values())


def test_rows_track_add_and_finish(untied):
    e = make_engine(untied, max_num_seqs=3)
    assert e.debug.num_rows == 3 + 1
    assert e.debug.rows() == {}
    p = random_prompts([4, 9, 6], seed=5)
    e.add_request(p[0], greedy(2), req_id="a")
    e.add_request(p[1], greedy(12), req_id="b")
    assert e.debug.row_of("a") is None, "no row before the first step"
    e.step()
    rows = e.debug.rows()
    assert set(rows) == {"a", "b"} and rows["a"] != rows["b"]
    assert e.debug.row_of("a") == rows["a"] and e.debug.row_of("zzz") is None
    rows["a"] = 99  # a copy: the runner's table is not touched
    assert e.debug.row_of("a") != 99
    row_a = e.debug.row_of("a")
    outs: dict = {}
    step_until(e, outs, lambda: "a" in outs)
    e.step()  # the finished id reaches the runner
    assert e.debug.row_of("a") is None and set(e.debug.rows()) == {"b"}
    e.add_request(p[2], greedy(2), req_id="c")
    e.step()
    assert e.debug.row_of("c") == row_a, "the freed row is taken again"
    drain(e, outs)
    e.step()
    assert e.debug.rows() == {}

    tables = e.debug.row_tables()
    assert {"req_state.token_ids", "req_state.block_table", "sampling.temperature"} <= tables.keys()
    assert all(t.shape[0] == e.debug.num_rows for t in tables.values())
    assert all(t.shape[1] == e.num_blocks for t in e.debug.paged_caches().values())


def test_step_hooks_bracket_each_step(untied):
    e = make_engine(untied)
    seen: list[tuple[str, dict, dict]] = []
    pending: dict = {}
    remove_before = e.debug.before_step(lambda out: pending.update(rows=e.debug.rows()))
    remove_after = e.debug.on_step(lambda out: seen.append((",".join(sorted(out.num_scheduled_tokens)),
                                                             pending["rows"], e.debug.rows())))
    e.add_request(random_prompts([5], seed=9)[0], greedy(3), req_id="q")
    e.step()
    assert seen == [("q", {}, {"q": e.debug.row_of("q")})]
    remove_before()
    remove_after()
    drain(e)
    assert len(seen) == 1, "removed hooks are not called"


def test_stop_recording_stops(untied):
    e = make_engine(untied)
    steps = e.debug.record_steps()
    calls: list[int] = []
    remove = e.debug.on_logits(lambda ids, lg: calls.append(len(ids)))
    run(e, [("a", random_prompts([5], seed=2)[0], greedy(3))])
    n, m = len(steps), len(calls)
    assert n == m == 3
    e.debug.stop_recording()
    remove()
    run(e, [("b", random_prompts([6], seed=4)[0], greedy(3))])
    assert len(steps) == n, "steps recorded after stop_recording"
    assert len(calls) == m, "a removed logits hook was called"
    e.debug.stop_recording()  # stopping twice is harmless
    assert e.debug.record_steps() is steps
    run(e, [("c", random_prompts([4], seed=6)[0], greedy(2))])
    assert len(steps) == n + 2 and steps[-1].req_ids == ["c"]


def test_sampling_host_state_tracks_each_stage(untied):
    """The suite's snapshots see the sampler's host mirrors: a sampled request with a cut
    and a logit bias shows up in its stages' state, and removing it restores the defaults."""
    e = make_engine(untied)
    empty = e.debug.sampling_host_state()
    assert {"TemperatureStage", "CutStage", "LogitBiasStage"} <= set(empty)
    from core_runner import SamplingParams

    e.add_request([5, 6, 7], SamplingParams(max_tokens=4, temperature=0.8, top_k=5, logit_bias={3: 1.0}),
                  req_id="a")
    e.step()
    busy = e.debug.sampling_host_state()
    row = e.debug.row_of("a")
    assert busy["TemperatureStage"]["users"] == [row] and busy["TemperatureStage"]["temperature_cpu"][row] == 0.8
    assert busy["CutStage"]["top_k_cpu"][row] == 5
    assert busy != empty
    drain(e)
    e.step()  # the runner frees a finished request's row at the start of the next step
    assert e.debug.rows() == {}
    assert e.debug.sampling_host_state() == empty
