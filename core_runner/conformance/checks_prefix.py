"""CR-EQ-09: the prefix cache changes no output.

One scripted workload runs on two engines built alike but for ``enable_prefix_caching``
(True / False), with 4-token blocks and a prompt prefix of five blocks shared by every
request; once with the default step budget and once, where chunked prefill is
supported, with 8 tokens a step. The script makes each kind of hit happen:

- ``B`` repeats ``A``'s prompt: it finds every block but the one holding its last token;
- ``C`` shares only the five-block prefix (a partial hit);
- both are admitted while ``A`` still runs (its blocks are shared, not free);
- one request is preempted after its hit and resumes from the blocks it cached itself;
- with the small budget, what follows a hit is prefilled in chunks;
- ``D`` and ``E`` arrive after every earlier request finished: their hits come from freed
  blocks kept in the LRU (``E`` of a generating model reuses ``A``'s generated tokens).

A generating model must give the same greedy tokens, and fp32 logits within 1e-5 at every
position both engines computed; a pooling model the same last-token embeddings (within
1e-5). The engine with the cache must report the hits (``num_cached_tokens``,
``scheduler.prefix_cache_hits``), the one without none. A model whose state is not all
in the paged KV cache (a Mamba hybrid's recurrent state) passes only if it starts a hit
request from the state at the cached offset: this same comparison is that check (its
cache-on engine keeps a row-state snapshot every block, ``mamba_block_size=4``, in 64 slots).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from core_runner.conformance.harness import Ctx, Recorder, drain, fail, greedy, step_until

BLOCK = 4
SHARED = 5 * BLOCK
CHUNK_BUDGET = 8
N_NEW = 8
SAME_ATOL = 1e-5


@dataclass
class Trace:
    """What an engine's scheduler did, step by step (``engine.debug.on_step``)."""

    steps: list[tuple[set[str], dict[str, int], dict[str, int]]] = field(default_factory=list)

    def __call__(self, out: Any) -> None:
        self.steps.append(({n.req_id for n in out.new_reqs}, dict(out.num_computed_tokens),
                           dict(out.num_scheduled_tokens)))

    def admissions(self, req_id: str) -> list[tuple[int, dict[str, int]]]:
        """(tokens found cached, every request scheduled in that step) at each admission."""
        return [(computed[req_id], scheduled) for new, computed, scheduled in self.steps if req_id in new]

    def chunked_after_hit(self, req_id: str, total: int) -> bool:
        """Whether a step computed part, not all, of the rest of a request admitted with a hit."""
        hit = False
        for new, computed, scheduled in self.steps:
            if req_id in new:
                hit = computed[req_id] > 0
            if hit and req_id in scheduled and computed[req_id] + scheduled[req_id] < total:
                return True
        return False


@dataclass
class Run:
    """One engine's pass over the script."""

    engine: Any
    trace: Trace
    prompts: dict[str, list[int]]
    outs: dict
    preempted: str | None = None
    rec: Recorder | None = None


def prefix_hit_equals_miss(ctx: Ctx) -> None:
    generate = "generate" in ctx.registration.tasks
    budgets: list[int | None] = [None] + ([CHUNK_BUDGET] if ctx.chunked else [])
    if not ctx.chunked:
        ctx.note("chunked_prefill is not supported: no chunked prefill after a hit")
    for budget in budgets:
        where = "default budget" if budget is None else f"max_num_batched_tokens={budget}"
        runs = {}
        for caching in (True, False):
            # a model with row state resumes a hit only at a state snapshot: one every block
            # here, and slots enough for every boundary of the script (no eviction)
            snaps = {"mamba_block_size": BLOCK, "mamba_cache_slots": 64} if caching and ctx.row_state else {}
            e = ctx.engine(enable_prefix_caching=caching, block_size=BLOCK, max_model_len=ctx.max_model_len(64),
                           max_num_batched_tokens=budget, **snaps)
            if e.plan.prefix_caching != caching:
                fail(f"enable_prefix_caching={caching} planned prefix_caching={e.plan.prefix_caching} ({e.plan})")
            runs[caching] = (_script_generate if generate else _script_embed)(ctx, e)
        on, off = runs[True], runs[False]
        resumed = _expect_hits(ctx, on, off, where, chunked=budget is not None, generate=generate)
        for rid in on.prompts:
            what = f"{where}: {rid} ({on.outs[rid].num_cached_tokens} cached tokens), prefix cache on vs off"
            if generate:
                _same_generation(ctx, on, off, rid, what)
            else:
                _same_embedding(ctx, on, off, rid, what)
        ctx.note(f"{where}: hits {[on.outs[r].num_cached_tokens for r in on.prompts]} tokens for "
                 f"{list(on.prompts)}; {on.engine.scheduler.prefix_cache_hits} of "
                 f"{on.engine.scheduler.prefix_cache_queries} looked-up tokens found{resumed}")


def _prompts(ctx: Ctx) -> dict[str, list[int]]:
    shared = ctx.ref.prompts([SHARED], seed=103)[0]
    tails = ctx.ref.prompts([5, 7, 3, 2], seed=107)
    a = shared + tails[0]
    return {"A": a, "B": list(a), "C": shared + tails[1], "D": shared + tails[2], "tail": tails[3]}


def _add(e: Any, rid: str, prompt: list[int], generate: bool) -> None:
    from core_runner import PoolingParams

    if generate:
        e.add_request(prompt, greedy(N_NEW), req_id=rid)
    else:
        e.add_request(prompt, None, req_id=rid, pooling_params=PoolingParams(pooling_type="last", normalize=False))


def _computed(e: Any, rid: str) -> int:
    req = e.scheduler.requests.get(rid)
    return -1 if req is None else req.num_computed_tokens


def _script_generate(ctx: Ctx, e: Any) -> Run:
    p = _prompts(ctx)
    trace, rec = Trace(), Recorder(e)
    e.debug.on_step(trace)
    outs: dict = {}
    _add(e, "A", p["A"], True)
    # A's full prompt blocks are cached (a model with row state computes them a snapshot
    # interval per step), and A runs on
    full = (len(p["A"]) - 1) // BLOCK * BLOCK
    step_until(e, outs, lambda: _computed(e, "A") >= full)
    _add(e, "B", p["B"], True)
    _add(e, "C", p["C"], True)
    b = e.scheduler.requests["B"]
    step_until(e, outs, lambda: len(b.output_token_ids) >= 3)
    e.debug.preempt("B")  # it resumes from the blocks it cached itself
    drain(e, outs)
    p["E"] = p["A"] + outs["A"].token_ids[:6] + p.pop("tail")  # A's generated tokens' blocks too
    _add(e, "D", p["D"], True)
    _add(e, "E", p["E"], True)
    drain(e, outs)
    return Run(e, trace, p, outs, preempted="B", rec=rec)


def _script_embed(ctx: Ctx, e: Any) -> Run:
    """Embedding requests end with their prefill: the owner still runs at a hit, and a
    request can be preempted after its hit, only when prompts are chunked."""
    p = _prompts(ctx)
    del p["tail"]
    trace = Trace()
    e.debug.on_step(trace)
    outs: dict = {}
    _add(e, "A", p["A"], False)
    step_until(e, outs, lambda: _computed(e, "A") >= SHARED or "A" in outs)
    _add(e, "B", p["B"], False)
    _add(e, "C", p["C"], False)
    step_until(e, outs, lambda: _computed(e, "C") > SHARED or "C" in outs)
    preempted = None
    if "C" not in outs:
        e.debug.preempt("C")
        preempted = "C"
    drain(e, outs)
    p["E"] = list(p["A"])
    _add(e, "D", p["D"], False)
    _add(e, "E", p["E"], False)
    drain(e, outs)
    return Run(e, trace, p, outs, preempted=preempted)


def _expect_hits(ctx: Ctx, on: Run, off: Run, where: str, chunked: bool, generate: bool) -> str:
    """The cache-on engine hit where the script makes hits possible; the other never did.
    Returns what the resumed request found, for the report."""
    full = (len(on.prompts["B"]) - 1) // BLOCK * BLOCK
    # E of a generating model is A's prompt and 6 of its tokens, then 2 others
    least = {"B": full, "C": SHARED, "D": SHARED,
             "E": (len(on.prompts["A"]) + 6) // BLOCK * BLOCK if generate else full}
    if on.outs["A"].num_cached_tokens:
        fail(f"{where}: A, the first request, found {on.outs['A'].num_cached_tokens} cached tokens in an empty cache")
    for rid, want in least.items():
        got = on.outs[rid].num_cached_tokens
        if got < want:
            fail(f"{where}: {rid} found {got} cached tokens, expected >= {want} (it shares {want} tokens, in full "
                 f"{BLOCK}-token blocks, with an earlier request)")
    if on.engine.scheduler.prefix_cache_hits <= 0:
        fail(f"{where}: scheduler.prefix_cache_hits is {on.engine.scheduler.prefix_cache_hits} with the cache on")
    missed = {r: o.num_cached_tokens for r, o in off.outs.items() if o.num_cached_tokens}
    if missed or off.engine.scheduler.prefix_cache_hits:
        fail(f"{where}: with enable_prefix_caching=False requests found cached tokens {missed} "
             f"(scheduler.prefix_cache_hits {off.engine.scheduler.prefix_cache_hits})")
    b_hit, b_step = on.trace.admissions("B")[0]
    if b_hit <= 0 or "A" not in b_step:
        if generate or chunked:
            fail(f"{where}: B was admitted with {b_hit} cached tokens beside {sorted(b_step)}, not with a hit "
                 "while A still ran")
        ctx.note(f"{where}: an embedding prompt ends in one step, so no hit while its owner ran")
    if on.preempted is not None:
        resumed = on.trace.admissions(on.preempted)[1:]
        if not resumed or resumed[0][0] <= 0:
            fail(f"{where}: {on.preempted} was preempted after its hit but resumed with "
                 f"{resumed[0][0] if resumed else 'no'} cached tokens")
        if on.outs[on.preempted].num_preemptions != 1:
            fail(f"{where}: {on.preempted} reports {on.outs[on.preempted].num_preemptions} preemptions, expected 1")
    elif chunked:
        fail(f"{where}: C finished before it could be preempted mid-prefill")
    else:
        ctx.note(f"{where}: an embedding prompt ends in one step, so none was preempted after its hit")
    if chunked and not any(on.trace.chunked_after_hit(r, len(on.prompts[r])) for r in ("B", "C", "D", "E")):
        fail(f"{where}: no request was prefilled in chunks after a hit")
    if on.preempted is None:
        return ""
    return f"; {on.preempted} resumed from {on.trace.admissions(on.preempted)[1][0]} cached tokens"


def _same_generation(ctx: Ctx, on: Run, off: Run, rid: str, what: str) -> None:
    theirs: dict[int, torch.Tensor] = dict(off.rec.logits_of(rid))
    ours = on.rec.logits_of(rid)
    first_sample = len(on.prompts[rid]) - 1
    last = first_sample + len(on.outs[rid].token_ids) - 1
    shared = {pos for pos, _ in ours if pos in theirs}
    missing = [pos for pos in range(first_sample, last + 1) if pos not in shared]
    if missing:
        fail(f"{what}: no logits recorded by both engines for positions {missing}")
    # a low-precision engine (--model --dtype) rounds differently when a hit changes the
    # step's shapes: the run's own tolerance then
    atol = SAME_ATOL if ctx.tolerance.exact else None
    for pos, lg in sorted(ours, key=lambda e: e[0]):  # the first position to differ is where a hit went wrong
        if pos in theirs:
            ctx.logit_error(lg, theirs[pos], f"{what}: logits of position {pos}", atol=atol)
    ctx.expect_tokens(on.outs[rid].token_ids, off.outs[rid].token_ids, what)


def _same_embedding(ctx: Ctx, on: Run, off: Run, rid: str, what: str) -> None:
    got, want = (r.outs[rid].outputs.data.float().cpu() for r in (on, off))
    err = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
    prev = ctx.metrics["max_logit_error"]
    ctx.metrics["max_logit_error"] = err if prev is None else max(prev, err)
    if not err <= SAME_ATOL:
        fail(f"{what}: last-token embedding differs by {err:.3g} > {SAME_ATOL:g} (shapes {tuple(got.shape)}, "
             f"{tuple(want.shape)})")
