"""CR-LP-01: logits processors are batch invariant on the family's engine. The suite
registers its own processor through the public contract (``core_runner.sdk.LogitsProcessor``,
``LLM(logits_processors=)``); every processor installed by entry point runs beside it, as
it does in every generating engine, so their invariance is checked too.

The suite's processor acts only on rows whose ``SamplingParams.extra_args`` carry
``cr_lp`` (a seed): it bans the row's last output token and lifts token
``(seed + 7 * len(output)) % vocab`` by ``BOOST``, so its effect depends on the row's
arguments and on its own output list as it grows; a row without arguments is untouched.
The workload: greedy and seeded requests, with and without arguments, of different lengths
(rows finish and are removed while others run), two more added while the batch runs (rows
added, positions shift), one preempted mid-decode and resumed (removed and added again),
chunked prefill at 8 tokens a step where supported, through a batch of at most 4 rows so
that requests wait. Each request must get the tokens it gets alone, and the greedy requests
with arguments the reference's greedy tokens with the same edit applied to its logits (only
when no other processor is installed, since one may edit every row).
"""
from __future__ import annotations

from typing import Any

import torch

from core_runner.conformance.harness import Ctx, fail
from core_runner.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality, installed_processors

KEY = "cr_lp"
BOOST = 4.0


def edit(logits: torch.Tensor, seed: int, output: list[int]) -> torch.Tensor:
    """The suite processor's edit of one row (in place), shared with the reference side."""
    if output:
        logits[int(output[-1])] = float("-inf")
    logits[(seed + 7 * len(output)) % logits.shape[-1]] += BOOST
    return logits


class SuiteProcessor(LogitsProcessor):
    """Per batch index: (seed, the request's live output list) for rows with ``cr_lp``."""

    def __init__(self, config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[int, list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for i in batch_update.removed:
            self.rows.pop(i, None)
        for i, params, _prompt, output in batch_update.added:
            seed = (getattr(params, "extra_args", None) or {}).get(KEY)
            if seed is None:
                self.rows.pop(i, None)
            else:
                self.rows[i] = (int(seed), output)
        for a, b, how in batch_update.moved:
            ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
            if ra is not None:
                self.rows[b] = ra
            if rb is not None and how == MoveDirectionality.SWAP:
                self.rows[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for i, (seed, output) in self.rows.items():
            edit(logits[i], seed, output)
        return logits


def _requests() -> list[tuple[str, int, dict]]:
    """(id, prompt length, SamplingParams fields): the first five start together, the last two later."""
    greedy, seeded = dict(temperature=0.0), dict(temperature=0.8, top_p=0.9)
    return [("A", 7, dict(greedy, max_tokens=10, extra_args={KEY: 11})),
            ("B", 12, dict(greedy, max_tokens=3)),
            ("C", 5, dict(seeded, seed=5, max_tokens=8, extra_args={KEY: 23})),
            ("D", 9, dict(seeded, seed=6, max_tokens=10)),
            ("E", 3, dict(greedy, max_tokens=5, extra_args={KEY: 31})),
            ("F", 10, dict(greedy, max_tokens=9, extra_args={KEY: 47})),
            ("G", 6, dict(greedy, max_tokens=7))]


LATE = ("F", "G")
PREEMPTED = "A"


def _params(fields: dict) -> Any:
    from core_runner import SamplingParams

    return SamplingParams(ignore_eos=True, **fields)


def _drive(engine: Any, work: list[tuple[str, list[int], dict]], late: tuple[str, ...] = (),
           preempt: str | None = None) -> dict:
    outputs: dict[str, Any] = {}
    pending = [w for w in work if w[0] in late]
    for rid, p, f in work:
        if rid not in late:
            engine.add_request(p, _params(f), req_id=rid)
    preempted, steps = preempt is None, 0
    while engine.has_unfinished_requests() or pending:
        if steps == 2:
            for rid, p, f in pending:
                engine.add_request(p, _params(f), req_id=rid)
            pending = []
        for o in engine.step():
            if o.finish_reason == "error":
                fail(f"request {o.req_id} finished with finish_reason 'error'")
            outputs[o.req_id] = o
        steps += 1
        if not preempted and steps >= 4 and preempt in engine.debug.preemptible():
            engine.debug.preempt(preempt)
            preempted = True
        if steps > 500:
            fail("the workload did not finish within 500 steps")
    if not preempted:
        fail(f"setup: request {preempt} was never preemptible mid-decode")
    return outputs


def processors_batch_invariant(ctx: Ctx) -> None:
    budget = {"max_num_batched_tokens": 8} if ctx.chunked else {}
    llm = ctx.llm(max_num_seqs=4, logits_processors=[SuiteProcessor], **budget)
    engine = llm.engine
    spec = _requests()
    prompts = ctx.ref.prompts([n for _, n, _ in spec], seed=601)
    work = [(rid, p, f) for (rid, _, f), p in zip(spec, prompts)]
    others = [c.__name__ for c in installed_processors()]
    alone = {rid: _drive(engine, [(rid, p, f)])[rid] for rid, p, f in work}
    mixed = _drive(engine, [(f"{rid}'", p, f) for rid, p, f in work], late=tuple(f"{r}'" for r in LATE),
                   preempt=f"{PREEMPTED}'")
    if mixed[f"{PREEMPTED}'"].num_preemptions < 1:
        fail(f"setup: request {PREEMPTED} reports no preemption")
    for rid, _p, f in work:
        got, want = list(mixed[f"{rid}'"].token_ids), list(alone[rid].token_ids)
        args = "with" if KEY in f.get("extra_args", {}) else "without"
        where = (f"request {rid} ({args} processor arguments, {'greedy' if f['temperature'] == 0 else 'seeded'}) "
                 f"in the mixed batch (rows finishing, added, preempted) vs alone")
        if len(got) != f["max_tokens"]:
            fail(f"{where}: {len(got)} tokens, it asked for {f['max_tokens']}")
        ctx.expect_tokens(got, want, where)
    changed = 0
    if not others:
        for rid, p, f in work:
            if f["temperature"] == 0 and KEY in f.get("extra_args", {}):
                changed += _expect_edited_greedy(ctx, p, list(alone[rid].token_ids), f["extra_args"][KEY], rid)
        if changed == 0:
            fail("the suite processor changed no greedy token: the check proves nothing (raise BOOST)")
    ctx.note(f"{len(work)} requests alone and in one batch of <= 4 rows ({', '.join(LATE)} added later, "
             f"{PREEMPTED} preempted{', prompts chunked at 8 tokens' if budget else ''}); "
             + (f"installed processors {others} ran too (the reference comparison needs the suite's alone)"
                if others else f"greedy requests with arguments equal the edited reference ({changed} tokens "
                               "moved by the edit)"))


def _expect_edited_greedy(ctx: Ctx, prompt: list[int], got: list[int], seed: int, rid: str) -> int:
    """The reference's greedy tokens with the edit applied; returns how many the edit moved."""
    moved = 0
    for k, token in enumerate(got):
        row = ctx.ref.logits(list(prompt) + got[:k])[-1].clone()
        plain = int(row.argmax())
        edited = edit(row, seed, got[:k])
        want = int(edited.argmax())
        if token != want:
            top = edited.topk(2).values
            gap = float(top[0] - top[1])
            if gap <= ctx.tolerance.tie:
                ctx.note(f"request {rid}: tie at output token {k} (edited reference gap {gap:.2g}); compared to it")
                return moved
            fail(f"request {rid} alone: output token {k} is {token}, the reference's edited greedy token is {want} "
                 f"(edited gap {gap:.3g}): the processor was not applied to its row as asked; engine {got}")
        moved += int(want != plain)
    return moved
