"""Persistent runner state: row independence, row reuse hygiene, dummy runs and
seeded sampling (CPU, float32, tiny random Qwen3)."""
from __future__ import annotations

import pytest
import torch
from helpers import (
    Recorder,
    device_tables,
    drain,
    fill_free_kv_blocks_with_garbage,
    fill_garbage,
    greedy,
    hf_greedy,
    make_engine,
    random_prompts,
    run,
    sampled,
    snapshot,
    snapshot_diff,
    step_until,
)

from core_runner.step_data.scheduler_output import SchedulerOutput

N_NEW = 12


def _filler_then(engine, rec, target_id, target_prompt, target_params, outs):
    """Occupy all four rows with fillers, let the two in rows 1 and 2 finish and be
    removed, then add the target while the others are still decoding. Returns the
    rows the early finishers held."""
    fill = random_prompts([5, 8, 14, 6], seed=23)
    plan = [("f0", fill[0], greedy(16)), ("f1", fill[1], greedy(2)), ("f2", fill[2], greedy(3)),
            ("f3", fill[3], greedy(16))]
    for rid, p, sp in plan:
        engine.add_request(p, sp, req_id=rid)
    rows = engine.runner.req_state.req_id_to_row
    step_until(engine, outs, lambda: {"f1", "f2"} <= outs.keys() and "f1" not in rows and "f2" not in rows)
    assert "f0" in rows and "f3" in rows, "the long fillers must still hold their rows"
    freed = {rec.rows_of("f1")[0], rec.rows_of("f2")[0]}
    engine.add_request(target_prompt, target_params, req_id=target_id)
    drain(engine, outs)
    return freed


# ---------------------------------------------------------------------------------
# 3. a greedy request does not depend on its batch or its row
# ---------------------------------------------------------------------------------
def test_greedy_output_independent_of_batch_and_row(untied):
    target = random_prompts([11], seed=31)[0]
    ref = hf_greedy(untied, target, N_NEW)
    comp = random_prompts([25, 3, 17, 2], seed=37)
    results = {}  # scenario -> (tokens, rows, sampling logits)

    def record(name, engine, rec, outs):
        rows = rec.rows_of("T")
        results[name] = (outs["T"].token_ids, rows, rec.sampling_logits("T", len(target)))
        assert len(set(rows)) == 1, f"{name}: the target changed rows without preemption: {rows}"

    # alone
    e = make_engine(untied, max_num_seqs=4)
    rec = Recorder(e)
    record("alone", e, rec, run(e, [("T", target, greedy(N_NEW))]))
    assert all(s.req_ids == ["T"] for s in rec.steps)

    # after three companions (greedy and unseeded sampled): last row, mixed batches
    e = make_engine(untied, max_num_seqs=4)
    rec = Recorder(e)
    outs = run(e, [("A", comp[0], greedy(N_NEW)), ("B", comp[1], sampled(20, seed=None, temperature=1.0)),
                   ("B2", comp[3], greedy(3)), ("T", target, greedy(N_NEW))])
    record("companions_first", e, rec, outs)
    assert outs["A"].token_ids == hf_greedy(untied, comp[0], N_NEW)

    # first, then companions whose chunked prefills share its decode steps
    e = make_engine(untied, max_num_seqs=4, max_num_batched_tokens=9)
    rec = Recorder(e)
    outs = run(e, [("T", target, greedy(N_NEW)), ("C", comp[2], greedy(N_NEW)),
                   ("D", comp[3], sampled(N_NEW, seed=3)), ("E", comp[0], greedy(N_NEW))])
    record("companions_after_chunked", e, rec, outs)
    assert any(len(s.req_ids) > 1 and s.num_scheduled["T"] == 1 and max(s.num_scheduled.values()) > 1
               for s in rec.steps if "T" in s.req_ids), "T never decoded next to a prefill"
    for rid, p in (("C", comp[2]), ("E", comp[0])):
        assert outs[rid].token_ids == hf_greedy(untied, p, N_NEW)

    # a row that other requests used and released, added while others decode
    e = make_engine(untied, max_num_seqs=4)
    rec = Recorder(e)
    outs = {}
    freed = _filler_then(e, rec, "T", target, greedy(N_NEW), outs)
    record("reused_row", e, rec, outs)
    assert results["reused_row"][1][0] in freed

    for name, (tokens, rows, _) in results.items():
        assert tokens == ref, f"{name} (row {rows[0]}): {tokens} != HF {ref}"
    distinct_rows = {rows[0] for _, rows, _ in results.values()}
    assert len(distinct_rows) >= 3, f"the scenarios should place the target in different rows: {results}"
    base = results["alone"][2]
    for name, (_, _, logits) in results.items():
        assert len(logits) == N_NEW
        for k, (a, b) in enumerate(zip(base, logits)):
            err = (a - b).abs().max().item()
            assert err <= 1e-5, f"{name}: logits of output token {k} differ from the lone run by {err:.3g}"


# ---------------------------------------------------------------------------------
# 4a. a reused row behaves like a fresh one, whatever garbage it held
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["greedy", "seeded_sampled"])
def test_reused_row_full_of_garbage_behaves_like_fresh(untied, kind):
    params = greedy(10) if kind == "greedy" else sampled(10, seed=77)
    z_prompt, x_prompt, y_prompt = random_prompts([13, 20, 9], seed=41)

    fresh = make_engine(untied, max_num_seqs=3)
    fresh_rec = Recorder(fresh)
    ref = run(fresh, [("Z", z_prompt, params)])["Z"]
    if kind == "greedy":
        assert ref.token_ids == hf_greedy(untied, z_prompt, 10)

    e = make_engine(untied, max_num_seqs=3)
    rec = Recorder(e)
    rs = e.runner.req_state
    outs = {}
    # X leaves non-default sampling settings in its row; Y keeps decoding throughout
    e.add_request(x_prompt, sampled(3, seed=5, temperature=1.3, top_k=7, top_p=0.5), req_id="X")
    e.add_request(y_prompt, greedy(16), req_id="Y")
    step_until(e, outs, lambda: "X" in outs and "X" not in rs.req_id_to_row)
    assert "Y" not in outs
    row = rec.rows_of("X")[0]
    assert row in rs.free_rows

    gen = torch.Generator().manual_seed(2024)
    tables = device_tables(e)
    assert {"req_state.token_ids", "req_state.block_table", "req_state.num_tokens", "req_state.num_computed",
            "req_state.num_prompt_tokens", "sampling.temperature", "sampling.top_k", "sampling.top_p",
            "sampling.seed"} <= tables.keys()
    for t in tables.values():
        fill_garbage(t, row, gen)  # the freed row
        fill_garbage(t, rs.scratch_row, gen)  # real steps must never read the scratch row
    assert fill_free_kv_blocks_with_garbage(e, gen) > 0

    e.add_request(z_prompt, params, req_id="Z")
    drain(e, outs)
    assert set(rec.rows_of("Z")) == {row}, "Z should have taken the freed, garbage-filled row"
    assert outs["Z"].token_ids == ref.token_ids, f"reused row: {outs['Z'].token_ids} != fresh {ref.token_ids}"
    assert outs["Y"].token_ids == hf_greedy(untied, y_prompt, 16)
    assert any("Y" in s.req_ids and "Z" in s.req_ids for s in rec.steps), "Z should share steps with Y"
    for k, (a, b) in enumerate(zip(fresh_rec.sampling_logits("Z", 13), rec.sampling_logits("Z", 13))):
        err = (a - b).abs().max().item()
        assert err <= 1e-5, f"logits of output token {k} differ from the fresh engine by {err:.3g}"


# ---------------------------------------------------------------------------------
# 4b. dummy runs change no persistent state
# ---------------------------------------------------------------------------------
DUMMY_PROMPTS = [30, 5, 12, 1]


def _dummy_test_requests():
    prompts = random_prompts(DUMMY_PROMPTS, seed=43)
    params = [greedy(10), greedy(10), greedy(10), sampled(10, seed=99)]
    return [(rid, p, sp) for rid, p, sp in zip("abcd", prompts, params)]


def test_dummy_run_changes_no_state_mid_generation(untied):
    opts = dict(max_num_seqs=4, max_num_batched_tokens=16)
    reqs = _dummy_test_requests()
    ref_engine = make_engine(untied, **opts)
    ref_rec = Recorder(ref_engine)
    ref = run(ref_engine, reqs)

    e = make_engine(untied, **opts)
    rec = Recorder(e)
    shapes = [(1, 1), (2, 9), (3, 3), (4, 16), (1, 128), (4, 128)]

    def dummies_leave_state_alone(when):
        before = snapshot(e)
        for nr, nt in shapes:
            e.dummy_run(nr, nt)
            diff = snapshot_diff(before, snapshot(e))
            assert not diff, f"{when}: dummy_run({nr}, {nt}) changed {diff}"
        live = list(e.runner.req_state.req_id_to_row)
        so = SchedulerOutput(
            num_scheduled_tokens={r: 1 + i for i, r in enumerate(live)} or {"x": 3},
            num_computed_tokens={r: 0 for r in live} or {"x": 0},
            finished_req_ids=set(live[:1]), preempted_req_ids=set(live[1:2]),
        )
        e.runner.execute_model(so, dummy=True)
        diff = snapshot_diff(before, snapshot(e))
        assert not diff, f"{when}: execute_model(dummy=True) changed {diff}"

    dummies_leave_state_alone("before any request")
    for rid, p, sp in reqs:
        e.add_request(p, sp, req_id=rid)
    outs = {}
    reqs_by_id = e.scheduler.requests

    def mid_generation():
        live = list(reqs_by_id.values())
        decoding = [r for r in live if r.output_token_ids]
        prefilling = [r for r in live if 0 < r.num_computed_tokens < r.num_prompt_tokens]
        return bool(decoding) and bool(prefilling)

    step_until(e, outs, mid_generation)
    assert len(e.runner.req_state.req_id_to_row) >= 2
    dummies_leave_state_alone("mid generation")
    step_until(e, outs, lambda: len(outs) >= 1)
    dummies_leave_state_alone("after a request finished")
    drain(e, outs)
    assert rec.num_dummy == 3 * (len(shapes) + 1)

    for rid, p, sp in reqs:
        assert outs[rid].token_ids == ref[rid].token_ids, rid
        if sp.temperature == 0.0:
            assert outs[rid].token_ids == hf_greedy(untied, p, 10), rid
    # the interleaved dummies left every real step bit-for-bit identical
    assert len(rec.steps) == len(ref_rec.steps)
    for k, (s, r) in enumerate(zip(rec.steps, ref_rec.steps)):
        assert s.req_ids == r.req_ids and s.rows == r.rows and s.num_scheduled == r.num_scheduled, k
        for rid in s.req_ids:
            assert torch.equal(s.logits[rid], r.logits[rid]), f"step {k} {rid}: logits changed after dummy runs"


def test_real_steps_never_touch_scratch_row(untied):
    """Padding and dummies point at the scratch row, so a whole generation (with chunked
    prefill, preemption and row reuse) must leave it as it was."""
    e = make_engine(untied, max_model_len=64, num_kv_blocks=16, max_num_batched_tokens=7, max_num_seqs=4)
    rs = e.runner.req_state
    before = {k: t[rs.scratch_row].clone() for k, t in device_tables(e).items()}
    prompts = random_prompts([40, 3, 22, 9, 31, 1], seed=47)
    outs = run(e, [(f"q{i}", p, greedy(N_NEW) if i % 2 else sampled(N_NEW, seed=i)) for i, p in enumerate(prompts)])
    assert e.scheduler.num_preemptions > 0
    for k, t in device_tables(e).items():
        assert torch.equal(t[rs.scratch_row], before[k]), f"{k}: scratch row was written"
    for i, p in enumerate(prompts):
        if i % 2:
            assert outs[f"q{i}"].token_ids == hf_greedy(untied, p, N_NEW)


# ---------------------------------------------------------------------------------
# 5. seeded sampling is a function of (seed, prompt) only
# ---------------------------------------------------------------------------------
SEEDED = dict(seed=1235, temperature=0.8, top_p=0.9)


@pytest.fixture(scope="module")
def seeded_alone(untied):
    prompt = random_prompts([9], seed=53)[0]
    e = make_engine(untied)
    out = run(e, [("T", prompt, sampled(N_NEW, **SEEDED))])["T"]
    assert out.seed == 1235 and len(out.token_ids) == N_NEW
    return prompt, out.token_ids


def test_seeded_sampling_is_random_and_seed_dependent(untied, seeded_alone):
    prompt, tokens = seeded_alone
    assert tokens != hf_greedy(untied, prompt, N_NEW), "temperature 0.8 sampled exactly the greedy tokens"
    e = make_engine(untied)
    outs = run(e, [("s2", prompt, sampled(N_NEW, **{**SEEDED, "seed": 4321})),
                   ("s3", prompt, sampled(N_NEW, **{**SEEDED, "seed": 1235}))])
    assert outs["s2"].token_ids != tokens, "seeds 1235 and 4321 gave the same tokens"
    assert outs["s3"].token_ids == tokens
    # the nucleus cut matters for these tokens, so the batch/row/preemption tests below
    # would notice a top_p that is dropped or applied to the wrong row
    e = make_engine(untied)
    no_cut = run(e, [("n", prompt, sampled(N_NEW, **{**SEEDED, "top_p": 1.0}))])["n"]
    assert no_cut.token_ids != tokens, "top_p=0.9 and top_p=1.0 sampled the same tokens"


def test_seeded_sampling_same_in_mixed_batch(untied, seeded_alone):
    prompt, tokens = seeded_alone
    comp = random_prompts([17, 4, 26], seed=59)
    e = make_engine(untied)
    rec = Recorder(e)
    outs = run(e, [
        ("g", comp[0], greedy(N_NEW)),
        ("s99", comp[1], sampled(N_NEW, seed=99, temperature=1.0, top_p=1.0, top_k=20)),
        ("u", comp[2], sampled(N_NEW, seed=None, temperature=0.7, top_p=1.0)),
        ("T", prompt, sampled(N_NEW, **SEEDED)),
        ("u2", prompt, sampled(N_NEW, seed=None, temperature=0.8, top_p=0.9)),
        ("T2", prompt, sampled(N_NEW, **SEEDED)),
    ])
    assert outs["T"].token_ids == tokens and outs["T2"].token_ids == tokens
    assert set(rec.rows_of("T")) == {3} and set(rec.rows_of("T2")) == {5}
    assert outs["g"].token_ids == hf_greedy(untied, comp[0], N_NEW)
    assert outs["u2"].token_ids != tokens, "an unseeded request reproduced seed 1235"


def test_seeded_sampling_same_in_reused_row(untied, seeded_alone):
    prompt, tokens = seeded_alone
    e = make_engine(untied, max_num_seqs=4)
    rec = Recorder(e)
    outs = {}
    freed = _filler_then(e, rec, "T", prompt, sampled(N_NEW, **SEEDED), outs)
    assert set(rec.rows_of("T")) <= freed and rec.rows_of("T")[0] != 0
    assert outs["T"].token_ids == tokens


@pytest.mark.parametrize("budget", [None, 8])
def test_seeded_sampling_same_after_preemption(untied, seeded_alone, budget):
    prompt, tokens = seeded_alone
    e = make_engine(untied, max_model_len=64, block_size=4, num_kv_blocks=16, max_num_batched_tokens=budget)
    rec = Recorder(e)
    comp = random_prompts([14, 12, 10], seed=61)
    reqs = [(f"c{i}", p, greedy(N_NEW)) for i, p in enumerate(comp)]
    reqs.append(("T", prompt, sampled(N_NEW, **SEEDED)))  # newest: the first to be preempted
    outs = run(e, reqs)
    assert outs["T"].num_preemptions > 0, "the small KV pool should have preempted T"
    assert any("T" in s.preempted for s in rec.steps)
    assert outs["T"].token_ids == tokens
    for i, p in enumerate(comp):
        assert outs[f"c{i}"].token_ids == hf_greedy(untied, p, N_NEW)


def test_seeded_sampling_same_for_other_block_size_and_chunking(untied, seeded_alone):
    prompt, tokens = seeded_alone
    e = make_engine(untied, block_size=3, max_num_batched_tokens=4)
    rec = Recorder(e)
    outs = run(e, [("g", random_prompts([6], seed=67)[0], greedy(N_NEW)), ("T", prompt, sampled(N_NEW, **SEEDED))])
    assert any(0 < s.num_computed.get("T", 0) < len(prompt) for s in rec.steps), "T's prompt was not chunked"
    assert outs["T"].token_ids == tokens


# ---------------------------------------------------------------------------------
# dummy run at the engine's own step budget (regression test)
# ---------------------------------------------------------------------------------
def test_dummy_run_at_full_step_budget(untied):
    """A warm-up / capture dummy run of the full step budget must work and change
    nothing. With max_model_len=128 the default budget is max(128, 2048) = 2048 tokens;
    spread over max_num_seqs=8 scratch-row requests that is 256 tokens each, past
    max_model_len (this used to raise IndexError in prepare_inputs_ref)."""
    e = make_engine(untied)
    cfg = e.config
    assert cfg.max_num_batched_tokens > cfg.max_model_len
    before = snapshot(e)
    e.dummy_run(cfg.max_num_seqs, cfg.max_num_batched_tokens)
    assert not snapshot_diff(before, snapshot(e))
    prompt = random_prompts([9], seed=71)[0]
    assert run(e, [("a", prompt, greedy(N_NEW))])["a"].token_ids == hf_greedy(untied, prompt, N_NEW)
