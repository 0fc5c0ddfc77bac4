"""CR-SPEC-01/02: speculative decoding changes no output, and leaves nothing in a row.

n-gram speculation (``SPEC``) proposes up to 3 tokens per decoding request and step; the
step computes the request's last token and the proposals together, and keeps the
proposals that equal the tokens sampled at their positions (``runner/spec_decode.py``).
Every position is sampled with the request's own (seed, position) noise, so a greedy or
seeded request gives exactly the tokens it gives without speculation. A model passes
only if a step that computes proposals leaves its state as if it had computed the
accepted ones alone: KV slots of rejected proposals are rewritten later, but a recurrent
state (Mamba) that advanced over them is wrong from the next step on, and the logits of
that step differ.

Logits of a verification step: ``engine.debug`` records, per request, the logits row that
sampled the last token the step appended (after the accepted proposals), not that of the
last scheduled position as ``Recorder.logits_of`` assumes; ``Sampled`` keys each row by
the index of that output token instead, which needs synchronous scheduling (the CPU
default).
"""
from __future__ import annotations

from typing import Any

import torch

from core_runner.conformance.harness import Ctx, Recorder, fail, greedy, run, sampled

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
N_OUT = 16
CHUNK_BUDGET = 8


class Sampled:
    """Drives a synchronous engine step by step and keeps, per request, the recorded logits
    that sampled each output token: ``logits[req_id][i]`` produced output token i."""

    def __init__(self, engine: Any) -> None:
        if engine.plan.async_scheduling:
            fail(f"speculative decoding planned with async scheduling ({engine.plan}): it must run synchronously")
        self.engine = engine
        self.rec = Recorder(engine)
        self.outs: dict = {}
        self.logits: dict[str, dict[int, torch.Tensor]] = {}
        self._seen = 0
        self._lens: dict[str, int] = {}

    def num_output(self, req_id: str) -> int:
        if req_id in self.outs:
            return len(self.outs[req_id].token_ids)
        return len(self.engine.scheduler.requests[req_id].output_token_ids)

    def step(self) -> None:
        for o in self.engine.step():
            if o.req_id in self.outs:
                fail(f"request {o.req_id} finished twice")
            self.outs[o.req_id] = o
        for s in self.rec.steps[self._seen:]:
            for rid, lg in s.logits.items():
                n = self.num_output(rid)
                if n > self._lens.get(rid, 0):  # a chunk that samples nothing appends nothing
                    self.logits.setdefault(rid, {})[n - 1] = lg
                self._lens[rid] = n
        self._seen = len(self.rec.steps)

    def until(self, cond: Any, max_steps: int = 3000) -> None:
        for _ in range(max_steps):
            if cond():
                return
            if not self.engine.has_unfinished_requests():
                fail("no unfinished request is left but the awaited condition never held")
            self.step()
        fail(f"condition not reached within {max_steps} steps")

    def drain(self) -> dict:
        self.until(lambda: not self.engine.has_unfinished_requests())
        return self.outs


def _speculating(ctx: Ctx, spec: dict | None = None, **opts: Any) -> Any:
    spec = dict(spec or SPEC)
    e = ctx.engine(speculative_config=spec, **opts)
    if e.plan.num_speculative_tokens != spec["num_speculative_tokens"]:
        fail(f"speculative_config={spec} planned num_speculative_tokens={e.plan.num_speculative_tokens}")
    return e


# ---------------------------------------------------------------------------------
# CR-SPEC-01
# ---------------------------------------------------------------------------------
def _workload(ctx: Ctx) -> list[tuple[str, list[int], Any]]:
    """Repetitive prompts (a short pattern repeated, or the model's own output: the n-gram
    finds its continuation) and random ones (proposals mostly rejected), greedy and
    seeded-sampled (top_p 0.9)."""
    a, b = ctx.ref.prompts([4, 3], seed=131)
    rep0, rep1 = (a * 5)[:18], (b * 5)[:13]
    rnd0, rnd1 = ctx.ref.prompts([15, 10], seed=137)
    loop = _echo_prompt(ctx, rnd1)
    return [("loop", loop, greedy(N_OUT)), ("rep0", rep0, greedy(N_OUT)), ("rep1", rep1, greedy(N_OUT)),
            ("rnd0", rnd0, greedy(N_OUT)), ("rnd1", rnd1, greedy(N_OUT)), ("seeded-rep", rep0, sampled(N_OUT, seed=11)),
            ("seeded-rnd", rnd1, sampled(N_OUT, seed=12)),
            # at 0.8 a tiny random model's distribution is flat and proposals almost never
            # match; a cold request gets some accepted under sampling too
            ("seeded-cold", rep1, sampled(N_OUT, seed=13, temperature=0.1))]


def _predicted(seq: list[int]) -> int | None:
    """What a 1-token lookup proposes after ``seq``: the token after the last token's
    previous occurrence."""
    for i in range(len(seq) - 2, -1, -1):
        if seq[i] == seq[-1]:
            return seq[i + 1]
    return None


def _echo_prompt(ctx: Ctx, first: list[int]) -> list[int]:
    """A prompt, the model's own greedy continuation of it, then the prompt again: a model
    whose state forgets fast (random recurrent examples repeat nothing they are shown)
    continues the second copy as it did the first, so lookups are accepted. Of a few such
    prompts, the first whose second greedy output token (the reference's; the first comes
    from the prefill, with no proposal) is what a lookup proposes after the first."""
    candidates = [first] + ctx.ref.prompts([10, 6, 4] * 5, seed=151)
    echoes = []
    for r in candidates:
        g = ctx.ref.greedy(r, 12)
        echo = r + g + r + g[:2]
        # the first output comes from the prefill; the proposals made after it must match
        t0, t1 = ctx.ref.greedy(echo, 2)
        if t1 == _predicted(echo + [t0]):
            ctx.note(f"echo prompt {len(echoes)} of {len(candidates)}: its second token is the lookup's proposal")
            return echo
        echoes.append(echo)
    return echoes[0]


def speculation_equals_plain_decoding(ctx: Ctx) -> None:
    budgets: list[int | None] = [None] + ([CHUNK_BUDGET] if ctx.chunked else [])
    if not ctx.chunked:
        ctx.note("chunked_prefill is not supported: prompts are prefilled in one step")
    drafted = accepted = 0
    for budget in budgets:
        where = "default budget" if budget is None else f"max_num_batched_tokens={budget}"
        opts = dict(max_num_seqs=8, max_num_batched_tokens=budget)
        base = ctx.engine(**opts)
        base_rec = Recorder(base)
        want = run(base, _workload(ctx))
        if base.scheduler.spec_num_draft_tokens:
            fail(f"{where}: the engine without speculative_config proposed {base.scheduler.spec_num_draft_tokens} "
                 "tokens")
        s = _run_preempting(ctx, where, chunked=budget is not None, **opts)
        for rid, prompt, _ in _workload(ctx):
            _same_request(ctx, where, rid, prompt, s, base_rec, want[rid])
        sch = s.engine.scheduler
        _expect_counts(where, sch, s.outs)
        drafted += sch.spec_num_draft_tokens
        accepted += sch.spec_num_accepted_tokens
        ctx.note(f"{where}: accepted/proposed " + ", ".join(
            f"{rid} {o.num_accepted_tokens}/{o.num_draft_tokens}" for rid, o in sorted(s.outs.items()))
            + f"; {sch.spec_num_drafts} verifications")
    ctx.note(f"{accepted} of {drafted} proposed tokens accepted")


def _run_preempting(ctx: Ctx, where: str, chunked: bool, spec: dict | None = None, **opts: Any) -> Sampled:
    """The workload with speculation; rep0 is preempted once it has verified proposals
    (no sample is in flight: the engine is synchronous)."""
    s = Sampled(_speculating(ctx, spec, **opts))
    e = s.engine
    requests = _workload(ctx)
    for rid, prompt, params in requests:
        e.add_request(prompt, params, req_id=rid)
    victim = e.scheduler.requests["rep0"]
    # after it verified proposals, or half-way if its lookups have not matched by then
    s.until(lambda: len(victim.output_token_ids) >= 4 and victim.num_draft_tokens > 0
            or len(victim.output_token_ids) >= N_OUT // 2)
    if not victim.num_draft_tokens:
        ctx.note(f"{where}: rep0 was preempted before any of its lookups matched")
    if "rep0" not in e.debug.preemptible():
        fail(f"{where}: rep0 is decoding but engine.debug.preemptible() is {e.debug.preemptible()}")
    e.debug.preempt("rep0")
    s.drain()
    if s.outs["rep0"].num_preemptions != 1:
        fail(f"setup: rep0 was preempted {s.outs['rep0'].num_preemptions} times, expected 1")
    rep0_len = len(dict((r, p) for r, p, _ in requests)["rep0"])
    if chunked and not any(0 < st.num_computed.get("rep0", 0) < rep0_len for st in s.rec.steps):
        fail(f"setup: {where} did not chunk rep0's prompt")
    return s


def _same_request(ctx: Ctx, where: str, rid: str, prompt: list[int], s: Sampled, base_rec: Recorder,
                  want: Any, reference: bool = True) -> None:
    o = s.outs[rid]
    what = (f"{where}: {rid} ({o.num_accepted_tokens}/{o.num_draft_tokens} proposals accepted"
            f"{', preempted once' if rid == 'rep0' else ''}), speculation vs none")
    theirs = base_rec.sampling_logits(rid, len(prompt))
    if len(theirs) != len(want.token_ids):
        fail(f"{where}: {rid} without speculation recorded {len(theirs)} sampling logits rows for "
             f"{len(want.token_ids)} tokens")
    ours = s.logits.get(rid, {})
    for i in sorted(ours):  # the first row to differ is where the state went wrong
        if i >= len(theirs):
            fail(f"{what}: logits recorded for output token {i} of {len(want.token_ids)}")
        ctx.logit_error(ours[i], theirs[i], f"{what}: logits of output token {i}")
    ctx.expect_tokens(o.token_ids, want.token_ids, what)
    if reference and not rid.startswith("seeded"):
        ctx.expect_greedy(prompt, o.token_ids, f"{where}: {rid} with speculation vs the reference")


def _expect_counts(where: str, sch: Any, outs: dict) -> None:
    if sch.spec_num_draft_tokens <= 0 or sch.spec_num_accepted_tokens <= 0:
        fail(f"{where}: {sch.spec_num_draft_tokens} tokens proposed and {sch.spec_num_accepted_tokens} "
             "accepted; the workload needs both")
    if sch.spec_num_accepted_tokens >= sch.spec_num_draft_tokens:
        fail(f"{where}: every one of {sch.spec_num_draft_tokens} proposals was accepted; none was rejected")
    per_request = (sum(o.num_draft_tokens for o in outs.values()), sum(o.num_accepted_tokens for o in outs.values()))
    if per_request != (sch.spec_num_draft_tokens, sch.spec_num_accepted_tokens):
        fail(f"{where}: the requests report {per_request[0]} proposed and {per_request[1]} accepted tokens, the "
             f"scheduler {sch.spec_num_draft_tokens} and {sch.spec_num_accepted_tokens}")


# ---------------------------------------------------------------------------------
# CR-SPEC-02
# ---------------------------------------------------------------------------------
def reused_row_after_speculation_is_fresh(ctx: Ctx) -> None:
    """S (speculative, longer than Z: its proposals stay in the token table past Z's
    tokens) runs to completion beside Y (which, asking for logprobs, never speculates);
    then each Z takes S's row, the only free one, and must equal Z in a fresh engine."""
    from core_runner import SamplingParams

    (a,) = ctx.ref.prompts([4], seed=151)
    s_prompt = (a * 6)[:22]
    y, b = ctx.ref.prompts([9, 3], seed=157)
    z = (b * 3)[:8]  # a repeated pattern: its lookups match, so Z is verified too
    # a cold seeded request: at 0.8 a tiny random model's samples rarely repeat, so lookups would not match
    kinds = {"Zg": lambda: greedy(12), "Zs": lambda: sampled(12, seed=21, temperature=0.1)}

    fresh = _speculating(ctx, max_num_seqs=2)
    fresh_s = Sampled(fresh)
    for rid, params in kinds.items():
        fresh.add_request(z, params(), req_id=rid)
    want = fresh_s.drain()
    if fresh.scheduler.spec_num_draft_tokens <= 0:  # a lookup that never matches verifies nothing
        ctx.note("Z was never verified in the fresh engine (its lookups found no match)")

    e = _speculating(ctx, max_num_seqs=2)  # S and Y fill both rows: Z can only take S's
    s = Sampled(e)
    e.add_request(s_prompt, greedy(N_OUT), req_id="S")
    e.add_request(y, SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True, logprobs=1), req_id="Y")
    s.until(lambda: "S" in s.outs)
    row = s.rec.rows_of("S")[-1]
    if s.outs["S"].num_draft_tokens <= 0:
        fail("setup: S proposed no token")
    previous = "S"
    for rid, params in kinds.items():
        e.add_request(z, params(), req_id=rid)
        s.until(lambda rid=rid: rid in s.outs)
        if set(s.rec.rows_of(rid)) != {row}:
            fail(f"setup: {rid} ran in rows {sorted(set(s.rec.rows_of(rid)))}, not in {previous}'s row {row}")
        what = f"{rid} in row {row} after {previous} (speculative) vs a fresh engine"
        got_l, want_l = s.logits.get(rid, {}), fresh_s.logits.get(rid, {})
        for i in sorted(got_l.keys() & want_l.keys()):
            ctx.logit_error(got_l[i], want_l[i], f"{what}: logits of output token {i}")
        ctx.expect_tokens(s.outs[rid].token_ids, want[rid].token_ids, what)
        if sorted(got_l) != sorted(want_l):
            fail(f"{what}: logits sampled output tokens {sorted(got_l)}, in the fresh engine {sorted(want_l)} "
                 "(the same tokens, verified in other steps)")
        previous = rid
    if "Y" in s.outs:
        fail("setup: Y finished before the last Z, which could then take Y's row (never speculative)")
    s.drain()
    if s.outs["Y"].num_draft_tokens:
        fail(f"Y asked for logprobs, which rules out speculation, yet proposed {s.outs['Y'].num_draft_tokens} tokens")
    ctx.expect_greedy(y, s.outs["Y"].token_ids, "Y (no speculation) beside speculative requests")
    ctx.note(f"S {s.outs['S'].num_accepted_tokens}/{s.outs['S'].num_draft_tokens} accepted; then Z "
             + ", ".join(f"{r} {s.outs[r].num_accepted_tokens}/{s.outs[r].num_draft_tokens}" for r in kinds)
             + f" in row {row}")
