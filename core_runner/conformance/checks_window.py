"""CR-EQ-14: sliding windows, for every example with a windowed layer.

A request several windows long (the smallest window of the example; capped so that the
CPU run stays short, noted when the cap leaves fewer than three windows) runs beside a
short one under chunked prefill with 4-token blocks. Then:

- logits equal the reference's at every chunk end and decode step (float32 tolerance);
- the blocks each windowed KV cache group holds for the long request (``engine.debug.
  blocks_held``) never exceed what its window and one step need, while the full groups
  hold the whole sequence: memory follows the window;
- the long request, preempted mid-decode, resumes and continues exactly the same;
- with prefix caching declared, a second request extending the long prompt hits past
  the window (a hit needs only the window's blocks) and gives the same tokens and logits
  within 1e-5 as the cache-off engine.
"""
from __future__ import annotations

from typing import Any

import pytest

from core_runner.conformance.harness import Ctx, Recorder, cdiv, drain, fail, greedy, run, step_until

BLOCK = 4
BUDGET = 8
N_NEW = 8
MAX_LONG = 384
SAME_ATOL = 1e-5


def _windows(e: Any) -> list[int]:
    return sorted({g["sliding_window"] for g in e.debug.kv_cache_groups() if g["sliding_window"] is not None})


def windowed_attention(ctx: Ctx) -> None:
    budget = BUDGET if ctx.chunked else None
    probe = ctx.engine(block_size=BLOCK, max_model_len=ctx.max_model_len(64))
    windows = _windows(probe)
    del probe
    if not windows:
        pytest.skip("not run: not applicable: no layer of this example has a sliding window")
    w = windows[0]
    length = min(3 * w + 13, MAX_LONG)
    if length < 2 * w:
        ctx.note(f"window {w}: the long request ({length} tokens) spans fewer than two windows (CPU cap)")
    max_len = ctx.max_model_len(length + 2 * N_NEW + 8)
    long_p, short_p = ctx.ref.prompts([min(length, max_len - 2 * N_NEW - 8), 5], seed=211)
    e = ctx.engine(block_size=BLOCK, max_model_len=max_len, max_num_batched_tokens=budget, max_num_seqs=2)
    rec = Recorder(e)
    peak = _run_tracking(e, [("long", long_p, greedy(N_NEW)), ("short", short_p, greedy(N_NEW))], "long")
    outs = peak.pop("outs")
    ctx.expect_logits_match_reference(rec, outs)
    step_tokens = budget or (len(long_p) + 1)
    for g, grp in enumerate(e.debug.kv_cache_groups()):
        win = grp["sliding_window"]
        held = peak["held"][g]
        if win is None:
            want = cdiv(len(long_p) + N_NEW - 1, BLOCK)
            if held < want:
                fail(f"KV cache group {g} (full attention) held at most {held} blocks for a request of "
                     f"{len(long_p) + N_NEW} tokens, fewer than the {want} it needs")
        else:
            bound = min(cdiv(win - 1 + step_tokens, BLOCK) + 1, cdiv(len(long_p) + N_NEW, BLOCK))
            if held > bound:
                fail(f"KV cache group {g} (sliding window {win}) held {held} blocks for one request, more than the "
                     f"{bound} its window and one step of {step_tokens} tokens need: blocks that left the window "
                     "are not freed")
    ctx.note(f"window {w}; long request {len(long_p)} tokens; peak blocks per group {peak['held']} "
             f"({[g['sliding_window'] for g in e.debug.kv_cache_groups()]})")
    _preempted_resumes(ctx, long_p, outs["long"].token_ids, max_len, budget)
    if ctx.registration.capability("prefix_caching").supported:
        _hit_past_window(ctx, long_p, w, max_len, budget)
    else:
        ctx.note("prefix_caching is not supported: no hit past the window")


def _run_tracking(e: Any, requests: list, watch: str) -> dict:
    for rid, prompt, params in requests:
        e.add_request(prompt, params, req_id=rid)
    outs: dict = {}
    held: list[int] = []
    while e.has_unfinished_requests():
        for o in e.step():
            outs[o.req_id] = o
        if watch in e.scheduler.requests:
            now = e.debug.blocks_held(watch)
            held = [max(a, b) for a, b in zip(held, now)] if held else now
    for rid, _p, params in requests:
        o = outs.get(rid)
        if o is None or o.outputs[0].finish_reason != "length" or len(o.outputs[0].token_ids) != params.max_tokens:
            fail(f"{rid} did not finish by length with {params.max_tokens} tokens: "
                 f"{None if o is None else (o.outputs[0].finish_reason, len(o.outputs[0].token_ids))}")
    if e.debug.num_free_blocks != e.num_blocks:
        fail(f"after every request finished {e.num_blocks - e.debug.num_free_blocks} KV blocks are still held")
    return {"outs": outs, "held": held}


def _preempted_resumes(ctx: Ctx, prompt: list[int], want: list[int], max_len: int, budget: int | None) -> None:
    e = ctx.engine(block_size=BLOCK, max_model_len=max_len, max_num_batched_tokens=budget, max_num_seqs=2,
                   enable_prefix_caching=False)
    e.add_request(prompt, greedy(N_NEW), req_id="p")
    outs: dict = {}
    req = e.scheduler.requests["p"]
    step_until(e, outs, lambda: len(req.output_token_ids) >= 3 and "p" in e.debug.preemptible())
    e.debug.preempt("p")
    drain(e, outs)
    got = list(outs["p"].token_ids)
    if got != list(want):
        fail(f"the long request preempted after 3 tokens continued {got}, without preemption {list(want)}")


def _hit_past_window(ctx: Ctx, prompt: list[int], w: int, max_len: int, budget: int | None) -> None:
    tail = ctx.ref.prompts([3], seed=223)[0]
    second = prompt + tail
    runs = {}
    for caching in (True, False):
        e = ctx.engine(block_size=BLOCK, max_model_len=max_len, max_num_batched_tokens=budget, max_num_seqs=2,
                       enable_prefix_caching=caching)
        rec = Recorder(e)
        first = run(e, [("A", prompt, greedy(N_NEW))])
        outs = run(e, [("B", second[: max_len - N_NEW], greedy(N_NEW))])
        runs[caching] = (e, rec, {**first, **outs})
    hit = runs[True][2]["B"].num_cached_tokens
    if len(prompt) > w + 2 * BLOCK and hit < len(prompt) - BLOCK - 1:
        fail(f"B extends A's {len(prompt)}-token prompt but found {hit} cached tokens: a hit past the window "
             f"({w}) needs only the window's blocks")
    for rid in ("A", "B"):
        a, b = runs[True][2][rid], runs[False][2][rid]
        if list(a.token_ids) != list(b.token_ids):
            fail(f"{rid}: tokens with the prefix cache {list(a.token_ids)} differ from without {list(b.token_ids)}")
        on = dict(runs[True][1].logits_of(rid))
        for pos, lg in runs[False][1].logits_of(rid):
            if pos in on:
                ctx.logit_error(on[pos], lg, f"{rid} at position {pos}, prefix cache on vs off", atol=SAME_ATOL)
    ctx.note(f"B hit {hit} of {len(second)} tokens past window {w}")
