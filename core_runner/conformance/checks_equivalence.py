"""CR-EQ-*: the engine running the plugin's model equals the reference, and scheduling
choices (chunking, batching, rows, preemption, async, graphs) never change the output."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from core_runner.conformance.harness import (
    Ctx,
    Recorder,
    drain,
    fail,
    greedy,
    run,
    sampled,
    step_until,
)

N_NEW = 12


def _greedy_all(ctx: Ctx, prompts: list[list[int]], outs: dict, prefix: str, n: int, where: str) -> None:
    for i, p in enumerate(prompts):
        o = outs[f"{prefix}{i}"]
        ctx.expect_greedy(p, o.token_ids, f"{where}: {prefix}{i} (prompt of {len(p)}, "
                                          f"{o.num_preemptions} preemptions)", n)


# ---------------------------------------------------------------------------------
# CR-EQ-01, CR-EQ-02
# ---------------------------------------------------------------------------------
EQ_LENGTHS = [1, 7, 16, 33]


def logits_match_reference(ctx: Ctx) -> None:
    prompts = ctx.ref.prompts(EQ_LENGTHS, seed=5)
    e = ctx.engine()
    rec = Recorder(e)
    outs = run(e, [(f"r{i}", p, greedy(8)) for i, p in enumerate(prompts)])
    first = rec.steps[0]
    if first.num_scheduled != {f"r{i}": n for i, n in enumerate(EQ_LENGTHS)}:
        fail(f"setup: the first step scheduled {first.num_scheduled}, not every whole prompt")
    checked = ctx.expect_logits_match_reference(rec, outs)
    _greedy_all(ctx, prompts, outs, "r", 8, "one-step prefill")
    ctx.note(f"{checked} logits rows compared with {ctx.registration.reference}")


def chunked_equals_full_prefill(ctx: Ctx) -> None:
    prompts = ctx.ref.prompts(EQ_LENGTHS, seed=5)
    reqs = [(f"r{i}", p, greedy(8)) for i, p in enumerate(prompts)]
    full = run(ctx.engine(), reqs)
    e = ctx.engine(max_num_batched_tokens=7)
    rec = Recorder(e)
    outs = run(e, [(r, p, greedy(8)) for r, p, _ in reqs])
    chunk_ends = [(s, r) for s in rec.steps for r in s.req_ids
                  if 0 < s.num_computed[r] + s.num_scheduled[r] < EQ_LENGTHS[int(r[1:])]]
    if not chunk_ends:
        fail("setup: max_num_batched_tokens=7 split no prompt")
    if max(s.num_tokens for s in rec.steps) > 7:
        fail("a step exceeded max_num_batched_tokens=7")
    for rid, _, _ in reqs:
        ctx.expect_tokens(outs[rid].token_ids, full[rid].token_ids, f"{rid}: chunked vs one-step prefill")
    _greedy_all(ctx, prompts, outs, "r", 8, "chunked prefill")
    checked = ctx.expect_logits_match_reference(rec, outs)
    ctx.note(f"{len(chunk_ends)} chunk ends; {checked} logits rows compared with the reference")


# ---------------------------------------------------------------------------------
# CR-EQ-03
# ---------------------------------------------------------------------------------
def after_fillers(ctx: Ctx, e: Any, rec: Recorder, target: tuple[str, list[int], Any], outs: dict) -> set[int]:
    """Fill all four rows, let the fillers in rows 1 and 2 finish and be removed, then add
    the target while the others decode. Returns the rows that were freed."""
    fill = ctx.ref.prompts([5, 8, 14, 6], seed=23)
    for rid, p, sp in [("f0", fill[0], greedy(16)), ("f1", fill[1], greedy(2)), ("f2", fill[2], greedy(3)),
                       ("f3", fill[3], greedy(16))]:
        e.add_request(p, sp, req_id=rid)
    step_until(e, outs, lambda: {"f1", "f2"} <= outs.keys() and e.debug.row_of("f1") is None
               and e.debug.row_of("f2") is None)
    rows = e.debug.rows()
    if "f0" not in rows or "f3" not in rows:
        fail("setup: the long fillers should still hold their rows")
    freed = {rec.rows_of("f1")[0], rec.rows_of("f2")[0]}
    e.add_request(target[1], target[2], req_id=target[0])
    drain(e, outs)
    return freed


def batch_and_row_do_not_matter(ctx: Ctx) -> None:
    target = ctx.ref.prompts([11], seed=31)[0]
    comp = ctx.ref.prompts([25, 3, 17, 2], seed=37)
    results: dict[str, tuple[list[int], list[int], list[torch.Tensor]]] = {}

    def record(name: str, rec: Recorder, outs: dict) -> None:
        rows = rec.rows_of("T")
        if len(set(rows)) != 1:
            fail(f"{name}: the target changed rows without a preemption: {rows}")
        results[name] = (outs["T"].token_ids, rows, rec.sampling_logits("T", len(target)))

    e = ctx.engine(max_num_seqs=4)
    rec = Recorder(e)
    record("alone", rec, run(e, [("T", target, greedy(N_NEW))]))

    e = ctx.engine(max_num_seqs=4)
    rec = Recorder(e)
    outs = run(e, [("A", comp[0], greedy(N_NEW)), ("B", comp[1], sampled(20, seed=None, temperature=1.0)),
                   ("C", comp[3], greedy(3)), ("T", target, greedy(N_NEW))])
    record("last row, mixed batch", rec, outs)
    ctx.expect_greedy(comp[0], outs["A"].token_ids, "companion A")

    e = ctx.engine(max_num_seqs=4, max_num_batched_tokens=9 if ctx.chunked else None)
    rec = Recorder(e)
    outs = run(e, [("T", target, greedy(N_NEW)), ("D", comp[2], greedy(N_NEW)),
                   ("E", comp[1], sampled(N_NEW, seed=3)), ("F", comp[0], greedy(N_NEW))])
    record("first row, companions prefilling beside its decode", rec, outs)
    if not any(len(s.req_ids) > 1 and s.num_scheduled["T"] == 1 and max(s.num_scheduled.values()) > 1
               for s in rec.steps if "T" in s.req_ids):
        fail("setup: the target never decoded next to a prefill")

    e = ctx.engine(max_num_seqs=4)
    rec = Recorder(e)
    outs = {}
    freed = after_fillers(ctx, e, rec, ("T", target, greedy(N_NEW)), outs)
    record("reused row", rec, outs)
    if results["reused row"][1][0] not in freed:
        fail("setup: the target did not take a freed row")

    for name, (tokens, rows, _) in results.items():
        ctx.expect_greedy(target, tokens, f"{name} (row {rows[0]})", N_NEW)
    if len({rows[0] for _, rows, _ in results.values()}) < 3:
        fail(f"setup: the target should run in at least 3 different rows: {[r[1][0] for r in results.values()]}")
    base = results["alone"][2]
    for name, (_, _, logits) in results.items():
        for k, (a, b) in enumerate(zip(base, logits)):
            ctx.logit_error(b, a, f"{name}: logits of output token {k} vs the target alone")


# ---------------------------------------------------------------------------------
# CR-EQ-04
# ---------------------------------------------------------------------------------
PREEMPT_LENGTHS = [40, 2, 13, 21, 29, 33, 17]


def preempt_resume_equals_uninterrupted(ctx: Ctx) -> None:
    prompts = ctx.ref.prompts(PREEMPT_LENGTHS, seed=11)
    budgets = [None, 7] if ctx.chunked else [None]
    for budget in budgets:
        opts = dict(max_model_len=ctx.max_model_len(64), max_num_batched_tokens=budget)
        e = ctx.engine(num_kv_blocks=ctx.pool(16 + (2 if budget else 0)), **opts)
        windowed = any(g["sliding_window"] for g in e.debug.kv_cache_groups())
        if windowed:
            # windowed groups give blocks back as requests advance: the smallest pool the
            # engine accepts (one request's peak) is the likeliest to run dry
            e = ctx.engine(num_kv_blocks=e.blocks_per_request() + (2 if budget else 0), **opts)
        rec = Recorder(e)
        outs = run(e, [(f"p{i}", p, greedy(N_NEW)) for i, p in enumerate(prompts)])
        where = f"small KV pool ({e.num_blocks} blocks), budget {e.config.max_num_batched_tokens}"
        if e.debug.num_preemptions == 0:
            if not ctx.paged:  # attention-free: no pool that could run dry
                ctx.note(f"{where}: no paged KV cache, so no pool runs dry (the forced preemptions below cover "
                         "resuming)")
            elif not windowed:
                fail(f"setup ({where}): the small KV pool preempted nothing")
            else:
                ctx.note(f"{where}: windowed layers free blocks as requests advance, so the smallest pool the engine "
                         "accepts never ran dry (the forced preemptions below and CR-EQ-14 cover resuming)")
        _greedy_all(ctx, prompts, outs, "p", N_NEW, where)
        ctx.expect_logits_match_reference(rec, outs)
        if e.debug.num_free_blocks != e.num_blocks:
            fail(f"{where}: {e.num_blocks - e.debug.num_free_blocks} KV blocks were not returned")
        ctx.note(f"{where}: {e.debug.num_preemptions} preemptions")

    e = ctx.engine(max_num_batched_tokens=5 if ctx.chunked else None)
    rec = Recorder(e)
    a, b = ctx.ref.prompts([21, 6], seed=13)
    outs: dict = {}
    e.add_request(b, greedy(N_NEW), req_id="B")
    e.add_request(a, greedy(N_NEW), req_id="A")
    req = e.scheduler.requests["A"]
    if ctx.chunked:
        step_until(e, outs, lambda: 0 < req.num_computed_tokens < len(a))
        e.debug.preempt("A")
    step_until(e, outs, lambda: len(req.output_token_ids) >= 4)
    e.debug.preempt("A")
    step_until(e, outs, lambda: len(req.output_token_ids) >= 5)
    e.debug.preempt("A")
    drain(e, outs)
    if outs["A"].num_preemptions != (3 if ctx.chunked else 2):
        fail(f"setup: A was preempted {outs['A'].num_preemptions} times")
    ctx.expect_greedy(a, outs["A"].token_ids, "A, force-preempted", N_NEW)
    ctx.expect_greedy(b, outs["B"].token_ids, "B, beside A", N_NEW)
    ctx.expect_logits_match_reference(rec, outs)


# ---------------------------------------------------------------------------------
# CR-EQ-05
# ---------------------------------------------------------------------------------
def same_seed_same_output(ctx: Ctx) -> None:
    ref = ctx.ref
    prompt = ref.prompts([9], seed=53)[0]

    def seeded(seed: int = 1234) -> Any:
        return sampled(N_NEW, seed=seed, temperature=0.8, top_p=0.9)

    tokens = run(ctx.engine(), [("T", prompt, seeded())])["T"].token_ids
    other = run(ctx.engine(), [("T", prompt, seeded(4321))])["T"].token_ids
    if other == tokens:
        fail("setup: seeds 1234 and 4321 sampled the same tokens; the example is too peaked to test seeding")
    if tokens == ref.greedy(prompt, N_NEW):
        fail("setup: temperature 0.8 sampled the greedy tokens; the example is too peaked to test seeding")

    comp = ref.prompts([17, 4, 26], seed=59)
    e = ctx.engine()
    rec = Recorder(e)
    outs = run(e, [("g", comp[0], greedy(N_NEW)), ("s99", comp[1], sampled(N_NEW, seed=99, temperature=1.0, top_k=20)),
                   ("u", comp[2], sampled(N_NEW, seed=None, temperature=0.7)), ("T", prompt, seeded()),
                   ("T2", prompt, seeded())])
    ctx.expect_tokens(outs["T"].token_ids, tokens, "seed 1234 in a mixed batch (row 3)")
    ctx.expect_tokens(outs["T2"].token_ids, tokens, "seed 1234 in a mixed batch (row 4)")
    if rec.rows_of("T")[0] == rec.rows_of("T2")[0]:
        fail("setup: T and T2 shared a row")
    ctx.expect_greedy(comp[0], outs["g"].token_ids, "greedy companion")

    e = ctx.engine(max_num_seqs=4)
    rec = Recorder(e)
    outs = {}
    after_fillers(ctx, e, rec, ("T", prompt, seeded()), outs)
    ctx.expect_tokens(outs["T"].token_ids, tokens, "seed 1234 in a reused row")

    e = ctx.engine(block_size=3, max_num_batched_tokens=4 if ctx.chunked else None)
    outs = run(e, [("g", ref.prompts([6], seed=67)[0], greedy(N_NEW)), ("T", prompt, seeded())])
    where = "seed 1234 with block_size 3" + (" and chunking" if ctx.chunked else "")
    ctx.expect_tokens(outs["T"].token_ids, tokens, where)

    def unseeded(engine_seed: int) -> list[list[int]]:
        e = ctx.engine(seed=engine_seed)
        outs = run(e, [(f"u{i}", p, sampled(N_NEW, seed=None, temperature=1.0)) for i, p in enumerate(comp)])
        return [outs[f"u{i}"].token_ids for i in range(len(comp))]

    a, b = unseeded(7), unseeded(7)
    if a != b:
        fail(f"two engines with seed=7 sampled different tokens for unseeded requests: {a} vs {b}")
    if unseeded(8) == a:
        fail("engine seeds 7 and 8 gave unseeded requests the same tokens: the engine seed has no effect")


# ---------------------------------------------------------------------------------
# CR-EQ-07 (CPU) and the GPU checks CR-EQ-06, CR-EQ-08 (CR-EQ-09: checks_prefix.py)
# ---------------------------------------------------------------------------------
def _mixed_workload(ctx: Ctx, e: Any) -> dict:
    prompts = ctx.ref.prompts([1, 30, 7, 19, 12, 3], seed=71)
    reqs = [(f"m{i}", p, greedy(N_NEW) if i % 2 == 0 else sampled(N_NEW, seed=i)) for i, p in enumerate(prompts)]
    outs = run(e, reqs)
    for i, p in enumerate(prompts):
        if i % 2 == 0:
            ctx.expect_greedy(p, outs[f"m{i}"].token_ids, f"m{i} ({'async' if e.plan.async_scheduling else 'sync'})")
    return outs


def async_equals_sync(ctx: Ctx) -> None:
    opts = dict(max_model_len=ctx.max_model_len(64), num_kv_blocks=ctx.pool(18),
                max_num_batched_tokens=7 if ctx.chunked else None)
    sync = ctx.engine(async_scheduling=False, **opts)
    want = _mixed_workload(ctx, sync)
    e = ctx.engine(async_scheduling=True, **opts)
    if not e.plan.async_scheduling:
        fail(f"async_scheduling=True gave a synchronous plan {e.plan}")
    got = _mixed_workload(ctx, e)
    for rid, o in want.items():
        ctx.expect_tokens(got[rid].token_ids, o.token_ids, f"{rid}: async vs sync scheduling")
    if sync.debug.num_preemptions == 0:
        ctx.note("the workload caused no preemption")


def _cuda_or_skip(ctx: Ctx) -> None:
    if not ctx.session.gpu:
        pytest.skip(f"not run: {ctx.session.gpu_reason}")


def _gpu_opts(ctx: Ctx, **kw: Any) -> dict:
    opts = dict(device="cuda", dtype="float32", block_size=16, max_model_len=ctx.max_model_len(128),
                max_num_seqs=8, num_kv_blocks=ctx.pool(64), max_num_batched_tokens=32 if ctx.chunked else None)
    opts.update(kw)
    return opts


def graph_equals_eager(ctx: Ctx) -> None:
    _cuda_or_skip(ctx)
    eager = ctx.engine(**_gpu_opts(ctx, enforce_eager=True))
    want = _mixed_workload(ctx, eager)
    e = ctx.engine(**_gpu_opts(ctx))
    if not e.plan.cuda_graphs or e.runner.graphs is None:
        fail(f"cuda_graphs is declared supported but the plan is eager: {e.plan}")
    before = e.debug.graph_replays
    got = _mixed_workload(ctx, e)
    replays = e.debug.graph_replays - before
    if not replays:
        fail("no CUDA graph was replayed")
    for rid, o in want.items():
        ctx.expect_tokens(got[rid].token_ids, o.token_ids, f"{rid}: graph replay vs eager")
    ctx.note(f"{replays} graph replays")


def triton_equals_torch_attention(ctx: Ctx) -> None:
    if ctx.registration.capability("triton_attention").not_applicable:
        ctx.confirm_not_applicable()
    _cuda_or_skip(ctx)
    torch_e = ctx.engine(**_gpu_opts(ctx, enforce_eager=True, attention_backend="torch"))
    triton_e = ctx.engine(**_gpu_opts(ctx, enforce_eager=True))
    if triton_e.plan.attention_backend != "triton":
        fail(f"triton_attention is declared supported but the plan uses {triton_e.plan.attention_backend}")
    recs = [Recorder(torch_e), Recorder(triton_e)]
    want, got = _mixed_workload(ctx, torch_e), _mixed_workload(ctx, triton_e)
    for rid, o in want.items():
        if int(rid[1:]) % 2 == 0:  # greedy; sampled tokens may flip on logit differences
            ctx.expect_tokens(got[rid].token_ids, o.token_ids, f"{rid}: Triton vs torch attention")
    for k, (a, b) in enumerate(zip(recs[0].steps, recs[1].steps)):
        for rid in a.req_ids:
            if rid in b.logits:
                ctx.logit_error(b.logits[rid], a.logits[rid], f"step {k} {rid}: Triton vs torch attention")

