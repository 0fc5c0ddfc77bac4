"""CR-STATE-01..05: persistent state hygiene (CR-STATE-06, the state machine, is machine.py)."""
from __future__ import annotations

import re
from typing import Any

import torch

from core_runner.conformance.harness import (
    Ctx,
    Recorder,
    cdiv,
    drain,
    fail,
    greedy,
    run,
    sampled,
    step_until,
    supports_logprobs,
)
from core_runner.conformance.state_tools import (
    fill_free_blocks_with_garbage,
    fill_garbage,
    paged_caches,
    row_tables,
    snapshot,
    snapshot_diff,
)


# ---------------------------------------------------------------------------------
# CR-STATE-01
# ---------------------------------------------------------------------------------
def reused_row_is_fresh(ctx: Ctx) -> None:
    z, x, y = ctx.ref.prompts([13, 20, 9], seed=41)
    filled: list[str] = []
    for kind in ("greedy", "seeded-sampled"):
        def params(kind: str = kind) -> Any:
            return greedy(10) if kind == "greedy" else sampled(10, seed=77, top_k=40)

        fresh = ctx.engine(max_num_seqs=3)
        fresh_rec = Recorder(fresh)
        want = run(fresh, [("Z", z, params())])["Z"]
        if kind == "greedy":
            ctx.expect_greedy(z, want.token_ids, "Z in a fresh engine")

        e = ctx.engine(max_num_seqs=3)
        rec = Recorder(e)
        outs: dict = {}
        # X leaves non-default settings and real state in its row; Y decodes throughout
        e.add_request(x, sampled(3, seed=5, temperature=1.3, top_k=7, top_p=0.5), req_id="X")
        e.add_request(y, greedy(16), req_id="Y")
        step_until(e, outs, lambda e=e, outs=outs: "X" in outs and e.debug.row_of("X") is None)
        if "Y" in outs:
            fail("setup: Y finished before X's row was freed")
        row = rec.rows_of("X")[0]
        gen = torch.Generator().manual_seed(2024)
        tables = row_tables(e)
        for t in tables.values():
            fill_garbage(t, row, gen)
            fill_garbage(t, e.runner.req_state.scratch_row, gen)  # real steps must never read the scratch row
        if fill_free_blocks_with_garbage(e, gen) == 0 and e.debug.paged_caches():
            fail("setup: no free KV block to fill")  # (an attention-free model has no KV block at all)
        filled = sorted(tables)

        e.add_request(z, params(), req_id="Z")
        drain(e, outs)
        if set(rec.rows_of("Z")) != {row}:
            fail(f"setup: Z ran in rows {sorted(set(rec.rows_of('Z')))}, not in the freed row {row}")
        ctx.expect_tokens(outs["Z"].token_ids, want.token_ids,
                          f"{kind} request in reused garbage-filled row {row} vs a fresh engine")
        ctx.expect_greedy(y, outs["Y"].token_ids, "Y, decoding beside the reused row")
        got_l, want_l = rec.sampling_logits("Z", len(z)), fresh_rec.sampling_logits("Z", len(z))
        for k, (a, b) in enumerate(zip(got_l, want_l)):
            ctx.logit_error(a, b, f"{kind}: logits of Z's output token {k}, reused row vs fresh engine")
    ctx.note(f"garbage-filled per-row buffers: {filled}")


# ---------------------------------------------------------------------------------
# CR-STATE-02
# ---------------------------------------------------------------------------------
def dummy_run_changes_nothing(ctx: Ctx) -> None:
    from core_runner.step_data.scheduler_output import SchedulerOutput

    opts = dict(max_num_seqs=4, max_num_batched_tokens=16 if ctx.chunked else None)
    prompts = ctx.ref.prompts([30, 5, 12, 1], seed=43)

    def requests() -> list:
        ps = [greedy(10), greedy(10), greedy(10), sampled(10, seed=99)]
        return [(rid, p, sp) for rid, p, sp in zip("abcd", prompts, ps)]

    base = ctx.engine(**opts)
    base_rec = Recorder(base)
    want = run(base, requests())

    e = ctx.engine(**opts)
    rebind_caches(e)
    rec = Recorder(e)
    c = e.config
    shapes = [(1, 1), (2, 9), (3, 3), (4, 16), (1, c.max_model_len), (c.max_num_seqs, c.max_num_batched_tokens)]

    def dummies_change_nothing(when: str) -> None:
        before = snapshot(e)
        for nr, nt in shapes:
            e.dummy_run(nr, nt)
            diff = snapshot_diff(before, snapshot(e))
            if diff:
                fail(f"{when}: dummy_run(num_reqs={nr}, num_tokens={nt}) changed {diff}")
        live = list(e.debug.rows())
        so = SchedulerOutput(
            num_scheduled_tokens={r: 1 + i for i, r in enumerate(live)} or {"x": 3},
            num_computed_tokens={r: 0 for r in live} or {"x": 0},
            finished_req_ids=set(live[:1]), preempted_req_ids=set(live[1:2]),
        )
        e.runner.execute_model(so, dummy=True)
        diff = snapshot_diff(before, snapshot(e))
        if diff:
            fail(f"{when}: execute_model(dummy=True) naming live requests changed {diff}")

    dummies_change_nothing("before any request")
    for rid, p, sp in requests():
        e.add_request(p, sp, req_id=rid)
    outs: dict = {}
    live = e.scheduler.requests

    def mid_generation() -> bool:
        decoding = [r for r in live.values() if r.output_token_ids]
        prefilling = [r for r in live.values() if 0 < r.num_computed_tokens < r.num_prompt_tokens]
        return bool(decoding) and (bool(prefilling) or not ctx.chunked) and len(live) >= 2

    step_until(e, outs, mid_generation)
    dummies_change_nothing("mid-generation")
    step_until(e, outs, lambda: len(outs) >= 1)
    dummies_change_nothing("after a request finished")
    drain(e, outs)
    for rid in "abcd":
        ctx.expect_tokens(outs[rid].token_ids, want[rid].token_ids, f"{rid} with dummy runs interleaved vs without")
    if len(rec.steps) != len(base_rec.steps):
        fail(f"dummy runs changed the schedule: {len(rec.steps)} real steps instead of {len(base_rec.steps)}")
    for k, (s, b) in enumerate(zip(rec.steps, base_rec.steps)):
        if s.req_ids != b.req_ids or s.rows != b.rows or s.num_scheduled != b.num_scheduled:
            fail(f"step {k}: dummy runs changed the batch ({s.num_scheduled} vs {b.num_scheduled})")
        for rid in s.req_ids:
            if not torch.equal(s.logits[rid], b.logits[rid]):
                ctx.logit_error(s.logits[rid], b.logits[rid], f"step {k} {rid} after dummy runs", atol=0.0)


def rebind_caches(e: Any) -> None:
    """What the engine's memory profile does on a GPU: release the bound caches, then bind
    the real ones. Released caches must be unreferenced (the layers and the ModelState
    took the zero-size ones in their place), or the profile's caches stay allocated beside
    the real pool."""
    import gc
    import weakref

    held = [t for v in e.runner.kv_caches.values() for t in (v if isinstance(v, (tuple, list)) else (v,))]
    refs = [weakref.ref(t) for t in held if t.numel()]
    del held
    e.executor.release_kv_caches()
    gc.collect()
    alive = sum(r() is not None for r in refs)
    if alive:
        fail(f"release_kv_caches: {alive} of {len(refs)} released cache tensors are still referenced (a bind "
             "kept them: the layers or the ModelState must hold only the caches bound last)")
    e.executor.initialize_kv_cache(e.num_blocks)


# ---------------------------------------------------------------------------------
# CR-STATE-03
# ---------------------------------------------------------------------------------
def _logprob_shape(out: Any) -> Any:
    """Entries per generated token of the first sample (vLLM's ``outputs[0].logprobs``)."""
    lp = out.outputs[0].logprobs
    if lp is None:
        return None
    return [len(x) if hasattr(x, "__len__") else 1 for x in lp]


def settings_survive_chunking_and_preemption(ctx: Ctx) -> None:
    ref = ctx.ref
    prompt = ref.prompts([21], seed=53)[0]
    comp = ref.prompts([14, 12, 10], seed=61)
    n = 12

    def target() -> Any:
        return sampled(n, seed=1234, temperature=0.8, top_p=0.9, top_k=50, logprobs=3)

    alone = run(ctx.engine(), [("T", prompt, target())])["T"]
    ctx.note("settings: temperature 0.8, top_p 0.9, top_k 50, seed 1234"
             + (", logprobs 3" if supports_logprobs() else " (SamplingParams has no logprobs yet)"))
    if supports_logprobs() and not _logprob_shape(alone):
        fail("a request asking for logprobs=3 returned none")
    greedy_tokens = ref.greedy(prompt, n)
    if alone.token_ids == greedy_tokens:
        fail("setup: temperature 0.8 sampled the greedy tokens; the example is too peaked to test sampling settings")

    def check(name: str, outs: dict) -> None:
        o = outs["T"]
        ctx.expect_tokens(o.token_ids, alone.token_ids, f"{name}: sampled tokens vs the request run alone")
        if _logprob_shape(o) != _logprob_shape(alone):
            fail(f"{name}: logprobs per token {_logprob_shape(o)} != {_logprob_shape(alone)} when run alone")
        for i, p in enumerate(comp):
            if f"c{i}" in outs:
                ctx.expect_greedy(p, outs[f"c{i}"].token_ids, f"{name}: companion c{i}")

    budget = 5 if ctx.chunked else None
    if ctx.chunked:
        e = ctx.engine(max_num_batched_tokens=budget)
        rec = Recorder(e)
        outs = run(e, [("c0", comp[0], greedy(n)), ("T", prompt, target())])
        if not any(0 < s.num_computed.get("T", 0) < len(prompt) for s in rec.steps):
            fail("setup: T's prompt was not chunked")
        check("chunked prefill", outs)

    if ctx.paged:
        e = ctx.engine(max_model_len=ctx.max_model_len(64), num_kv_blocks=ctx.pool(16),
                       max_num_batched_tokens=8 if ctx.chunked else None)
        outs = run(e, [*((f"c{i}", p, greedy(n)) for i, p in enumerate(comp)), ("T", prompt, target())])
        if outs["T"].num_preemptions == 0:
            fail("setup: the small KV pool did not preempt T")
        check("preempted by a small KV pool", outs)
    else:
        ctx.note("no paged KV cache: no pool runs dry (the forced preemptions below cover resuming)")

    e = ctx.engine(max_num_batched_tokens=budget)
    outs = {}
    e.add_request(comp[1], greedy(n), req_id="c1")
    e.add_request(prompt, target(), req_id="T")
    req = e.scheduler.requests["T"]
    if ctx.chunked:
        step_until(e, outs, lambda: 0 < req.num_computed_tokens < len(prompt))
        e.debug.preempt("T")
    step_until(e, outs, lambda: len(req.output_token_ids) >= 3)
    e.debug.preempt("T")
    drain(e, outs)
    want = 2 if ctx.chunked else 1
    if outs["T"].num_preemptions != want:
        fail(f"setup: T was preempted {outs['T'].num_preemptions} times, expected {want}")
    check("forced preemption" + (" mid-prefill and mid-decode" if ctx.chunked else " mid-decode"), outs)


# ---------------------------------------------------------------------------------
# CR-STATE-04
# ---------------------------------------------------------------------------------
_HOOKS = ("remove_request", "add_request", "apply_staged_writes", "prepare_inputs", "prepare_attn",
          "prepare_dummy_inputs", "postprocess_state")
_REAL = re.compile(r"^(remove )*(add )*apply (inputs attn forward logits post )?$")
_DUMMY = re.compile(r"^dummy attn forward logits $")
_SHORT = {"remove_request": "remove", "add_request": "add", "apply_staged_writes": "apply",
          "prepare_inputs": "inputs", "prepare_attn": "attn", "prepare_dummy_inputs": "dummy",
          "postprocess_state": "post", "forward": "forward", "compute_logits": "logits"}


def event_order(ctx: Ctx) -> None:
    e = ctx.engine(max_num_seqs=3, max_num_batched_tokens=6 if ctx.chunked else None)
    events: list[tuple[str, tuple, dict]] = []
    state, model = e.model_state, e.model

    def wrap(obj: Any, name: str) -> None:  # the plugin's own objects, observed
        inner = getattr(obj, name)

        def hook(*args: Any, **kw: Any) -> Any:
            events.append((name, args, kw))
            return inner(*args, **kw)

        setattr(obj, name, hook)

    for name in _HOOKS:
        wrap(state, name)
    wrap(model, "forward")
    wrap(model, "compute_logits")

    # one entry per execute_model call: engine.debug brackets every step, the dummy run
    # below is bracketed here
    calls: list[dict] = []
    rows_before: dict[str, int] = {}

    def before(out: Any) -> None:
        rows_before.clear()
        rows_before.update(e.debug.rows())
        del events[:]

    def after(out: Any, dummy: bool = False) -> None:
        calls.append(dict(out=out, dummy=dummy, events=list(events), rows_before=dict(rows_before),
                          rows_after=e.debug.rows()))

    e.debug.before_step(before)
    e.debug.on_step(after)
    prompts = ctx.ref.prompts([5, 9, 3, 12, 7], seed=67)
    lens = [2, 6, 8, 4, 3]
    outs: dict = {}
    for i, (p, n) in enumerate(zip(prompts, lens)):
        e.add_request(p, greedy(n), req_id=f"r{i}")
    b = e.scheduler.requests["r1"]
    step_until(e, outs, lambda: len(b.output_token_ids) >= 2)
    e.debug.preempt("r1")
    before(None)
    e.dummy_run(2, 7)
    after(None, dummy=True)
    drain(e, outs)
    e.step()  # the last finished ids reach the runner

    saw_swap = saw_preempt = False
    preempted_ever: set[str] = set()
    for k, c in enumerate(calls):
        seq = "".join(_SHORT[n] + " " for n, _, _ in c["events"])
        out = c["out"]
        if c["dummy"]:
            if not _DUMMY.match(seq):
                fail(f"dummy call {k}: ModelState events {seq!r}; a dummy run may only prepare dummy inputs, "
                     "attention metadata and run the model")
            continue
        if not _REAL.match(seq):
            fail(f"step {k}: events {seq!r} break the contract order "
                 "remove* add* apply_staged_writes [prepare_inputs prepare_attn forward compute_logits postprocess]")
        gone = out.finished_req_ids | out.preempted_req_ids
        removed = sorted(args[0] for n, args, _ in c["events"] if n == "remove_request")
        want_removed = sorted(c["rows_before"][r] for r in gone if r in c["rows_before"])
        if removed != want_removed:
            fail(f"step {k}: remove_request rows {removed}, expected {want_removed} for {sorted(gone)}")
        added = {args[1].req_id: args[0] for n, args, _ in c["events"] if n == "add_request"}
        want_added = {n.req_id: c["rows_after"].get(n.req_id) for n in out.new_reqs}
        if added != want_added:
            fail(f"step {k}: add_request got {added}, expected the scheduler's new requests in their rows {want_added}")
        saw_swap |= bool(removed) and bool(added)
        preempted_ever |= out.preempted_req_ids
        saw_preempt |= bool(preempted_ever & set(added))
        batches = [args[0] for n, args, _ in c["events"]
                   if n in ("prepare_inputs", "prepare_attn", "postprocess_state")]
        if batches:
            if any(bt is not batches[0] for bt in batches):
                fail(f"step {k}: prepare_inputs, prepare_attn and postprocess_state saw different batches")
            bt = batches[0]
            if sorted(bt.req_ids) != sorted(out.num_scheduled_tokens):
                fail(f"step {k}: the batch holds {bt.req_ids}, the scheduler scheduled "
                     f"{sorted(out.num_scheduled_tokens)}")
            rows = bt.idx_mapping_cpu[:bt.num_reqs].tolist()
            if rows != [c["rows_after"][r] for r in bt.req_ids]:
                fail(f"step {k}: idx_mapping {rows} does not give each request its row")
            sampled_ids = [args[1] for n, args, _ in c["events"] if n == "postprocess_state"][0]
            if sampled_ids is None or sampled_ids.shape[0] != bt.num_reqs:
                fail(f"step {k}: postprocess_state got {None if sampled_ids is None else tuple(sampled_ids.shape)} "
                     f"sampled ids for {bt.num_reqs} requests (sampling must come first)")
    if not saw_swap:
        fail("setup: no step removed and added requests together")
    if not saw_preempt:
        fail("setup: the forced preemption never came back as a re-add")
    for i, p in enumerate(prompts):
        ctx.expect_greedy(p, outs[f"r{i}"].token_ids, f"r{i}")


# ---------------------------------------------------------------------------------
# CR-STATE-05
# ---------------------------------------------------------------------------------
def _state_tensors(state: Any) -> dict[str, torch.Tensor]:
    out = {}
    for name, v in vars(state).items():
        if name == "model":
            continue
        t = v if isinstance(v, torch.Tensor) else getattr(v, "gpu", None)
        if isinstance(t, torch.Tensor):
            out[name] = t
    out.update({f"row_buffers.{k}": t for k, t in state.row_buffers().items()})
    return out


def buffers_sized_from_limits(ctx: Ctx) -> None:
    limits = [dict(max_num_seqs=2, max_model_len=ctx.max_model_len(32), block_size=4, num_kv_blocks=ctx.pool(20)),
              dict(max_num_seqs=5, max_model_len=ctx.max_model_len(64), block_size=8, num_kv_blocks=ctx.pool(40))]
    totals = []
    max_pos = ctx.ref.max_position
    for lim in limits:
        e = ctx.engine(**lim)
        rows = lim["max_num_seqs"] + 1
        where = f"limits {lim}"
        rs_tables = e.runner.req_state.tables()
        want = {"token_ids": (rows, lim["max_model_len"]),
                "block_table": (rows, cdiv(lim["max_model_len"], lim["block_size"]))}
        for name, t in rs_tables.items():
            if t.shape[0] != rows or (name in want and tuple(t.shape) != want[name]):
                fail(f"{where}: req_state.{name} has shape {tuple(t.shape)}")
        for name, t in row_tables(e).items():
            if t.shape[0] != rows:
                fail(f"{where}: {name} has {t.shape[0]} rows, expected max_num_seqs + 1 = {rows}")
        if lim["num_kv_blocks"] is None and e.num_blocks:  # ctx.pool: no paged layer
            fail(f"{where}: a model without paged layers has a KV pool of {e.num_blocks} blocks")
        for name, t in paged_caches(e).items():
            if t.shape[1] != lim["num_kv_blocks"] or t.shape[2] != lim["block_size"]:
                fail(f"{where}: {name} has shape {tuple(t.shape)}: expected {lim['num_kv_blocks']} blocks of "
                     f"{lim['block_size']}")
        if e.runner.inputs.out["input_ids"].numel() != e.config.max_num_batched_tokens:
            fail(f"{where}: the runner's input buffers are not sized from max_num_batched_tokens")
        tensors = _state_tensors(e.model_state)
        if max_pos and max_pos > lim["max_model_len"]:
            big = [n for n, t in tensors.items() if max_pos in t.shape]
            if big:
                fail(f"{where}: ModelState buffers {big} have a dimension of max_position_embeddings={max_pos}, "
                     f"not max_model_len={lim['max_model_len']}")
        totals.append(sum(t.numel() * t.element_size() for t in tensors.values()))
    if totals[0] > totals[1]:
        fail(f"the ModelState holds more memory for the smaller workload ({totals[0]} > {totals[1]} bytes)")
    ctx.note(f"ModelState tensor bytes at the two limits: {totals}")
