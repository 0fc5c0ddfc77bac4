"""CR-TP-01: tensor parallelism on the CPU (gloo) equals one rank.

For each example (and, where the example has as many KV heads as ranks or more, a
variant with one KV head, so that the ranks replicate it), the same requests run at
tensor_parallel_size=1 and 2 with chunked prefill (where declared) and a forced
preemption; greedy tokens must be equal and every step's logits within 1e-4 (float32).
A pooling model compares its embeddings instead. An example whose sizes do not divide
by two is reported as not applicable; at least one must run.
"""
from __future__ import annotations

from typing import Any

import torch

from core_runner.conformance.harness import (
    Ctx,
    Example,
    Recorder,
    examples_of,
    fail,
    greedy,
    reference_config,
    step_until,
)

TP = 2
LENGTHS = [5, 19, 11]
NEW_TOKENS = 6
ATOL = 1e-4


def _one_kv_head(ctx: Ctx, ex: Example) -> Example | None:
    cfg = reference_config(ctx.registration, ex)
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    if not isinstance(kv, int) or kv < TP or not isinstance(heads, int) or heads % TP:
        return None
    return Example(f"{ex.name}~kv1", {**ex.config, "num_key_value_heads": 1})


def _generate(ctx: Ctx, ref: Any, tp: int) -> tuple[dict, dict]:
    """Greedy outputs and per-request logits of one engine, one request preempted once."""
    opts: dict[str, Any] = dict(tensor_parallel_size=tp)
    if ctx.chunked:
        opts["max_num_batched_tokens"] = 8
    old, ctx.reference = ctx.reference, ref
    try:
        llm = ctx.llm(**opts)
    finally:
        ctx.reference = old
    e = llm.engine
    try:
        rec = Recorder(e)
        prompts = ref.prompts(LENGTHS, seed=41)
        for i, p in enumerate(prompts):
            e.add_request(p, greedy(NEW_TOKENS), req_id=f"t{i}")
        outs: dict = {}
        # preempt the longest request once it has decoded a token, then let all finish
        step_until(e, outs, lambda: "t1" in e.debug.preemptible()
                   and any(s.num_computed.get("t1", 0) >= LENGTHS[1] for s in rec.steps))
        e.debug.preempt("t1")
        step_until(e, outs, lambda: not e.has_unfinished_requests())
        logits = {f"t{i}": rec.logits_of(f"t{i}") for i in range(len(LENGTHS))}
        return {k: v.token_ids for k, v in outs.items()}, logits
    finally:
        e.shutdown()


def _compare_generate(ctx: Ctx, ref: Any, name: str) -> str:
    tokens1, logits1 = _generate(ctx, ref, 1)
    tokens2, logits2 = _generate(ctx, ref, TP)
    worst, rows = 0.0, 0
    for rid in sorted(tokens1):
        if tokens2.get(rid) != tokens1[rid]:
            fail(f"{name}: request {rid} gave {tokens2.get(rid)} at tensor_parallel_size={TP}, {tokens1[rid]} at 1")
        a, b = logits1[rid], logits2[rid]
        if [p for p, _ in a] != [p for p, _ in b]:
            fail(f"{name}: request {rid} was computed at positions {[p for p, _ in b]} at tensor_parallel_size="
                 f"{TP}, {[p for p, _ in a]} at 1 (the schedules differ)")
        for (pos, x), (_, y) in zip(a, b):
            err = float((x - y).abs().max())
            worst, rows = max(worst, err), rows + 1
            if err > ATOL:
                fail(f"{name}: request {rid} position {pos}: logits differ by {err:.3g} > {ATOL} between "
                     f"tensor_parallel_size={TP} and 1")
    return f"{name}: {rows} logits rows, max |diff| {worst:.2e}"


def _compare_embed(ctx: Ctx, ref: Any, name: str) -> str:
    """Embeddings, or a classifier's raw logits, at tensor_parallel_size TP and 1."""
    prompts = ref.prompts(LENGTHS, seed=43)
    from core_runner.conformance.checks_perturbed import head_task

    task = head_task(ctx)
    what = f"{task} logits" if task else "embeddings"
    got = []
    for tp in (1, TP):
        old, ctx.reference = ctx.reference, ref
        try:
            llm = ctx.llm(tensor_parallel_size=tp)
        finally:
            ctx.reference = old
        try:
            if task:  # raw logits: saturated probabilities would hide a difference
                from core_runner import PoolingParams

                outs = getattr(llm, task)(prompts, PoolingParams(use_activation=False), use_tqdm=False)
            else:
                outs = llm.embed(prompts, use_tqdm=False)
            got.append(torch.cat([o.outputs.data.float().reshape(-1) for o in outs]))  # per-token rows vary
        finally:
            llm.engine.shutdown()
    err = float((got[0] - got[1]).abs().max())
    if err > ATOL:
        fail(f"{name}: {what} differ by {err:.3g} > {ATOL} between tensor_parallel_size={TP} and 1")
    return f"{name}: {len(prompts)} {what}, max |diff| {err:.2e}"


def tensor_parallel_equals_one_rank(ctx: Ctx) -> None:
    reg = ctx.registration
    cases = []
    for ex in examples_of(reg):
        cases.append(ex)
        variant = _one_kv_head(ctx, ex)
        if variant is not None and not any(c.name.endswith("~kv1") for c in cases):
            cases.append(variant)
    ran = 0
    for ex in cases:
        ref = ctx.session.reference(reg, ex) if "~" not in ex.name else ctx.session.scratch_reference(reg, ex)
        compare = _compare_generate if "generate" in reg.tasks else _compare_embed
        try:
            ctx.note(compare(ctx, ref, ex.name))
            ran += 1
        except ValueError as e:
            if "tensor_parallel_size" not in str(e) or "divisible" not in str(e):
                raise
            ctx.note(f"{ex.name}: not applicable at tensor_parallel_size={TP}: {e}")
    if not ran:
        fail(f"no example of {reg.architecture} divides across {TP} ranks")

