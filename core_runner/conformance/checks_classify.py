"""Equivalence checks of classifier registrations (task ``classify``): CR-EQ-15, and of
reward models (task ``reward``, the same workload through ``LLM.reward``): CR-EQ-16.

The reference is the registration's transformers sequence classifier: its logits for
one prompt at a time (batch 1, no padding), activated as transformers' loss reads the
config (sigmoid when ``num_labels == 1`` or ``problem_type`` is
``multi_label_classification``, else softmax), are what ``LLM.classify`` must return.
Every request must finish normally with one vector of ``num_labels`` values, in prompt
order; probabilities within 1e-5 and raw logits (``use_activation=False``) within 1e-4
of the reference, in a batch of mixed lengths mixing both, under chunked prefill with
chunk ends inside the prompts (where the model supports it) and in rows freed by longer
requests.
"""
from __future__ import annotations

from typing import Any

import torch

from core_runner.conformance.checks_pooling import (
    CHUNK_BUDGETS,
    CHUNK_LENGTHS,
    LENGTHS,
    LONG_LENGTHS,
    NO_CACHE,
    SHORT_LENGTHS,
    _Watch,
)
from core_runner.conformance.harness import Ctx, fail

PROB_ATOL = 1e-5  # probabilities against the reference (float32)
LOGIT_ATOL = 1e-4  # raw logits against the reference


def activation_of(config: Any) -> str:
    """"sigmoid" or "softmax", as transformers' sequence classifiers read ``config``."""
    if int(config.num_labels) == 1 or getattr(config, "problem_type", None) == "multi_label_classification":
        return "sigmoid"
    return "softmax"


def reference_output(ctx: Ctx, prompt: list[int], activate: bool) -> torch.Tensor:
    logits = ctx.ref.class_logits(prompt)
    if not activate:
        return logits
    return torch.sigmoid(logits) if activation_of(ctx.ref.model.config) == "sigmoid" else torch.softmax(logits, -1)


def _classify(ctx: Ctx, llm: Any, prompts: list[list[int]], activate: list[bool], where: str,
              watch: bool = False, task: str = "classify") -> tuple[list[torch.Tensor], _Watch | None, list[str]]:
    from core_runner import PoolingParams

    w = _Watch(llm.engine) if watch else None
    try:
        outs = getattr(llm, task)(prompts, [PoolingParams(use_activation=a) for a in activate], use_tqdm=False)
    finally:
        if w is not None:
            w.stop()
    if len(outs) != len(prompts):
        fail(f"{where}: {len(outs)} outputs for {len(prompts)} prompts")
    for i, (p, o) in enumerate(zip(prompts, outs)):
        what = f"{where}: prompt {i} (length {len(p)})"
        if not o.finished or o.finish_reason != "stop" or o.outputs is None:
            fail(f"{what} finished={o.finished} with finish_reason {o.finish_reason!r} (expected 'stop' and "
                 "one probability vector)")
        if list(o.prompt_token_ids) != list(p):
            fail(f"{what}: its output is for another prompt: outputs out of order")
        want = tuple(ctx.ref.class_logits(p).shape)  # (num_labels,), or (len(p), num_labels) per token
        if tuple(o.outputs.data.shape) != want:
            fail(f"{what}: output of shape {tuple(o.outputs.data.shape)}, expected {want} (the reference's logits)")
    return [o.outputs.data.float() for o in outs], w, [o.request_id for o in outs]


def _vs_reference(ctx: Ctx, prompts: list[list[int]], activate: list[bool], got: list[torch.Tensor], where: str,
                  steps: list[list[int]] | None = None) -> None:
    for i, (p, a, g) in enumerate(zip(prompts, activate, got)):
        want = reference_output(ctx, p, a)
        err = float((g - want).abs().max())
        prev = ctx.metrics["max_logit_error"]
        ctx.metrics["max_logit_error"] = err if prev is None else max(prev, err)
        atol = PROB_ATOL if a else LOGIT_ATOL
        if not err <= atol:
            split = f", run in steps of {steps[i]} tokens" if steps and len(steps[i]) > 1 else ""
            fail(f"{where}: prompt {i} (length {len(p)}{split}) {'probabilities' if a else 'raw logits'} differ "
                 f"from the reference by {err:.3g} > {atol:g}" + ctx.diagnosis(p))


def _mixed(n: int, r: int = 0) -> list[bool]:
    return [(i + r) % 3 != 2 for i in range(n)]  # mostly activated, raw logits beside them


def probabilities_match_reference(ctx: Ctx) -> None:
    _matches_reference(ctx, "classify")


def rewards_match_reference(ctx: Ctx) -> None:
    """CR-EQ-16: ``LLM.reward`` equals the reference head's logits (raw by default)."""
    _matches_reference(ctx, "reward")


def _matches_reference(ctx: Ctx, task: str) -> None:
    llm = ctx.llm(**NO_CACHE)
    prompts = ctx.ref.prompts(LENGTHS, seed=301)
    for activate in ([True] * len(prompts), _mixed(len(prompts))):
        got, _, _ = _classify(ctx, llm, prompts, activate, "one batch of mixed lengths", task=task)
        _vs_reference(ctx, prompts, activate, got, "one batch of mixed lengths")
    notes = [f"{activation_of(ctx.ref.model.config)} over {ctx.ref.model.config.num_labels} labels, "
             f"{len(prompts)} prompts in one batch, raw logits mixed in"]
    chunks = ctx.registration.capability("chunked_prefill").supported
    if chunks:
        cp = ctx.ref.prompts(CHUNK_LENGTHS, seed=307)
        boundaries = 0
        for budget in CHUNK_BUDGETS:
            where = f"chunks of <= {budget} tokens"
            act = _mixed(len(cp), budget)
            got, w, ids = _classify(ctx, ctx.llm(max_num_batched_tokens=budget, **NO_CACHE), cp, act, where, True, task)
            for rid, p in zip(ids, cp):
                pieces = w.chunks.get(rid, [])
                if sum(pieces) != len(p) or (len(p) > budget and len(pieces) < 2):
                    fail(f"setup ({where}): the prompt of {len(p)} tokens ran in steps of {pieces}")
                boundaries += len(pieces) - 1
            _vs_reference(ctx, cp, act, got, where, [w.chunks[rid] for rid in ids])
        notes.append(f"{boundaries} chunk boundaries inside prompts (budgets {list(CHUNK_BUDGETS)})")
    else:
        notes.append("chunked_prefill is not supported: the chunk part was not run")
    budget = CHUNK_BUDGETS[-1] if chunks else None
    small = ctx.llm(max_num_seqs=2, max_num_batched_tokens=budget, **NO_CACHE)  # two rows: both are reused
    longs, shorts = ctx.ref.prompts(LONG_LENGTHS, seed=311), ctx.ref.prompts(SHORT_LENGTHS, seed=313)
    where = "rows reused after longer requests"
    got, w, ids = _classify(ctx, small, longs, _mixed(len(longs)), where, True, task)
    longest = {}
    for rid, p in zip(ids, longs):
        longest[w.row[rid]] = max(longest.get(w.row[rid], 0), len(p))
    act = _mixed(len(shorts), 1)
    got, w, ids = _classify(ctx, small, shorts, act, where, True, task)
    for rid, p in zip(ids, shorts):
        if longest.get(w.row.get(rid), 0) <= len(p):
            fail(f"setup ({where}): the request of {len(p)} tokens ran in row {w.row.get(rid)}, which no longer "
                 f"request used before it (rows: longest request so far {longest})")
    _vs_reference(ctx, shorts, act, got, where, [w.chunks.get(rid, []) for rid in ids])
    notes.append(f"{len(shorts)} requests in rows freed by longer ones")
    others = [t for t in ("classify", "reward") if t != task and t in ctx.registration.tasks]
    if others:
        notes.append(_mixed_tasks(ctx, task, others[0]))
    ctx.note("; ".join(notes))


def _mixed_tasks(ctx: Ctx, task: str, other: str) -> str:
    """Requests of two tasks of one model queued together (one step when the budget allows),
    each with that task's default activation, against the reference."""
    from core_runner import PoolingParams

    llm = ctx.llm(**NO_CACHE)
    prompts = ctx.ref.prompts(LENGTHS, seed=317)
    tasks = [task if i % 2 == 0 else other for i in range(len(prompts))]
    ids = [llm.engine.add_request({"prompt_token_ids": p}, pooling_params=PoolingParams(task=t))
           for p, t in zip(prompts, tasks)]
    done: dict[str, Any] = {}
    for _ in range(10 * len(prompts) + 10):
        for o in llm.engine.step():
            done[o.request_id] = o
        if not llm.engine.has_unfinished_requests():
            break
    where = f"a batch mixing tasks {task!r} and {other!r}"
    for i, (rid, p, t) in enumerate(zip(ids, prompts, tasks)):
        o = done.get(rid)
        if o is None or o.finish_reason != "stop" or o.outputs is None:
            fail(f"{where}: prompt {i} (task {t!r}) did not finish normally: {o!r}"[:400])
        activate = PoolingParams(task=t).activate
        want = reference_output(ctx, p, activate)
        got = o.outputs.data.float().cpu()
        err = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
        atol = PROB_ATOL if activate else LOGIT_ATOL
        if not err <= atol:
            fail(f"{where}: prompt {i} (length {len(p)}, task {t!r}, activation {'on' if activate else 'off'}) "
                 f"differs from the reference by {err:.3g} > {atol:g}")
    return f"{len(prompts)} requests mixing tasks {task} and {other} in one batch"
