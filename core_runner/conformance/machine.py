"""CR-STATE-06: a Hypothesis state machine drives one small engine through random
add / step / preempt / abort / finish sequences. The model of the system is simple: every
request's tokens must be a prefix of its uninterrupted greedy reference, and a finished
request holds exactly ``min(max_tokens, max_model_len - prompt)`` of them. A tiny KV pool
makes the scheduler preempt on its own; the ``preempt`` rule forces it as well."""
from __future__ import annotations

from typing import Any

from core_runner.conformance.harness import Ctx, fail, greedy

MAX_MODEL_LEN = 48
BLOCK_SIZE = 4
NUM_BLOCKS = 12  # exactly one max-length request: the scheduler preempts often
PROMPT_LENGTHS = [1, 5, 12, 23, 30, MAX_MODEL_LEN - 1]
MAX_LIVE = 5


def random_lifecycles(ctx: Ctx) -> None:
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

    ctx.diagnose = False  # Hypothesis replays a failure many times while it shrinks it
    mml = ctx.max_model_len(MAX_MODEL_LEN)
    lengths = [min(n, mml - 1) for n in PROMPT_LENGTHS]
    prompts = ctx.ref.prompts(lengths, seed=101)
    budget = 8 if ctx.chunked else None
    stats = {"preemptions": 0, "by_the_pool": 0, "aborts": 0, "finished": 0, "examples": 0}

    def expected_len(prompt: list[int], max_tokens: int) -> int:
        return min(max_tokens, mml - len(prompt))

    class Lifecycles(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.engine = ctx.engine(max_model_len=mml, max_num_seqs=3, block_size=BLOCK_SIZE,
                                     num_kv_blocks=ctx.pool(max(NUM_BLOCKS, -(-mml // BLOCK_SIZE))),
                                     max_num_batched_tokens=budget)
            self.live: dict[str, tuple[list[int], int]] = {}
            self.done: set[str] = set()
            self.aborted: set[str] = set()
            self.n = 0
            self.forced = 0
            stats["examples"] += 1

        def _take(self, outputs: list) -> None:
            for o in outputs:
                if o.req_id in self.aborted:
                    fail(f"aborted request {o.req_id} produced an output")
                if o.req_id in self.done:
                    fail(f"request {o.req_id} finished twice")
                prompt, max_tokens = self.live.pop(o.req_id)
                n = expected_len(prompt, max_tokens)
                if o.finish_reason != "length":
                    fail(f"{o.req_id} finished with {o.finish_reason!r}, expected 'length'")
                ctx.expect_greedy(prompt, o.token_ids, f"{o.req_id} (prompt {len(prompt)}, max_tokens {max_tokens}, "
                                                       f"{o.num_preemptions} preemptions)", n)
                self.done.add(o.req_id)
                stats["finished"] += 1

        @precondition(lambda self: len(self.live) < MAX_LIVE)
        @rule(which=st.integers(0, len(prompts) - 1), max_tokens=st.integers(1, 10))
        def add(self, which: int, max_tokens: int) -> None:
            rid = f"r{self.n}"
            self.n += 1
            self.engine.add_request(prompts[which], greedy(max_tokens), req_id=rid)
            self.live[rid] = (prompts[which], max_tokens)

        @rule(k=st.integers(1, 3))
        def step(self, k: int) -> None:
            for _ in range(k):
                self._take(self.engine.step())

        @precondition(lambda self: bool(self.engine.debug.preemptible()))
        @rule(data=st.data())
        def preempt(self, data: Any) -> None:
            rid = data.draw(st.sampled_from(sorted(self.engine.debug.preemptible())))
            self.engine.debug.preempt(rid)
            self.forced += 1
            stats["preemptions"] += 1

        @precondition(lambda self: bool(self.live))
        @rule(data=st.data())
        def abort(self, data: Any) -> None:
            rid = data.draw(st.sampled_from(sorted(self.live)))
            self.engine.abort_request(rid)
            del self.live[rid]
            self.aborted.add(rid)
            stats["aborts"] += 1

        @precondition(lambda self: bool(self.live))
        @rule()
        def finish(self) -> None:
            """Step until some request finishes."""
            before = len(self.done)
            for _ in range(200):
                self._take(self.engine.step())
                if len(self.done) > before or not self.live:
                    return
            fail("no request finished within 200 steps")

        @invariant()
        def prefixes_and_blocks(self) -> None:
            sched = self.engine.scheduler
            for rid, (prompt, _max_tokens) in self.live.items():
                req = sched.requests.get(rid)
                if req is None:
                    fail(f"live request {rid} vanished from the scheduler")
                got = list(req.output_token_ids)
                if got:
                    ctx.expect_greedy(prompt, got, f"{rid} in flight", len(got))
            # the prefix cache shares blocks between requests: count each held block once
            held = len({b for r in sched.requests.values() for b in sched.kv.held(r.block_ids)})
            free = self.engine.debug.num_free_blocks
            if held + free != self.engine.num_blocks:
                fail(f"KV blocks leaked: {held} held + {free} free != {self.engine.num_blocks}")
            if len(self.engine.debug.rows()) > 3:
                fail("more runner rows in use than max_num_seqs")

        def teardown(self) -> None:
            for _ in range(500):
                if not self.engine.has_unfinished_requests():
                    break
                self._take(self.engine.step())
            if self.live:
                fail(f"requests {sorted(self.live)} never finished")
            self.engine.step()  # the last finished ids reach the runner
            stats["by_the_pool"] += self.engine.debug.num_preemptions - self.forced
            if self.engine.debug.rows():
                fail(f"rows still held after every request ended: {self.engine.debug.rows()}")

    run_state_machine_as_test(Lifecycles, settings=settings(
        max_examples=ctx.session.machine_examples, stateful_step_count=25, deadline=None, database=None,
        derandomize=True, suppress_health_check=list(HealthCheck), print_blob=False, report_multiple_bugs=False,
    ))
    ctx.note(f"{stats['examples']} runs: {stats['finished']} requests finished, {stats['preemptions']} forced and "
             f"{stats['by_the_pool']} KV-pool preemptions, {stats['aborts']} aborts")
