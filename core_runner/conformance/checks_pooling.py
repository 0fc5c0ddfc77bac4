"""Equivalence checks of embedding registrations (task ``embed``): CR-EQ-10, CR-EQ-11.

The reference is the registration's reference class (an encoder or a decoder base
model): its final hidden states, pooled here by each pooling type, are what the engine's
``LLM.embed`` must return. Pooling types the model does not accept must be refused with a
ValueError naming them; at least one must be accepted.
"""
from __future__ import annotations

from typing import Any

import torch

from core_runner.conformance.harness import Ctx, fail

EMBED_ATOL = 1e-4
SAME_ATOL = 1e-5
LENGTHS = [1, 9, 3, 17, 6, 30]


def pool_hidden(hidden: torch.Tensor, kind: str) -> torch.Tensor:
    """The reference's [len, hidden] final states pooled as ``kind`` ("mean", "cls", "last")."""
    if kind == "mean":
        return hidden.mean(dim=0)
    if kind == "cls":
        return hidden[0]
    return hidden[-1]


def _embed(llm: Any, prompts: list[list[int]], kind: str | None, normalize: bool) -> list[torch.Tensor]:
    from core_runner import PoolingParams

    outs = llm.embed(prompts, PoolingParams(pooling_type=kind, normalize=normalize), use_tqdm=False)
    return [o.outputs.data.float() for o in outs]


def _close(got: torch.Tensor, want: torch.Tensor, atol: float, where: str, ctx: Ctx) -> None:
    err = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
    prev = ctx.metrics["max_logit_error"]
    ctx.metrics["max_logit_error"] = err if prev is None else max(prev, err)
    if not err <= atol:
        fail(f"{where}: embedding differs by {err:.3g} > {atol:g} (shape {tuple(got.shape)} vs {tuple(want.shape)})")


def _accepted_types(ctx: Ctx, llm: Any, prompt: list[int]) -> list[str]:
    from core_runner.pooling_params import POOLING_TYPES

    kinds = []
    for kind in POOLING_TYPES:
        try:
            _embed(llm, [prompt], kind, False)
        except ValueError as e:
            if kind not in str(e):
                fail(f"pooling_type={kind!r} was refused without naming it: {e}")
            ctx.note(f"pooling_type {kind!r} refused: {e}")
            continue
        kinds.append(kind)
    if not kinds:
        fail(f"every pooling type {POOLING_TYPES} was refused")
    return kinds


def embeddings_match_reference(ctx: Ctx) -> None:
    llm = ctx.llm()
    prompts = ctx.ref.prompts(LENGTHS, seed=201)
    for kind in _accepted_types(ctx, llm, prompts[0]):
        for normalize in (False, True):
            got = _embed(llm, prompts, kind, normalize)
            for i, (p, g) in enumerate(zip(prompts, got)):
                want = pool_hidden(ctx.ref.hidden(p), kind)
                if normalize:
                    want = torch.nn.functional.normalize(want, dim=-1)
                _close(g, want, EMBED_ATOL, f"prompt {i} (length {len(p)}) pooling {kind} normalize={normalize}",
                       ctx)
    _embed(llm, prompts, None, True)  # the model's default pooling runs too


def embedding_independent_of_batch_row_and_chunks(ctx: Ctx) -> None:
    llm = ctx.llm()
    prompts = ctx.ref.prompts(LENGTHS, seed=211)
    kind = _accepted_types(ctx, llm, prompts[0])[0]
    batch = _embed(llm, prompts, kind, False)
    for i in (4, 0):  # alone, after the batch's rows were used and freed
        alone = _embed(llm, [prompts[i]], kind, False)[0]
        _close(alone, batch[i], SAME_ATOL, f"prompt {i}: alone vs in a batch of {len(prompts)}", ctx)
    shuffled = _embed(llm, prompts[::-1], kind, False)[::-1]
    for i, (a, b) in enumerate(zip(shuffled, batch)):
        _close(a, b, SAME_ATOL, f"prompt {i}: reversed batch order (other rows)", ctx)
    if ctx.registration.capability("chunked_prefill").supported:
        chunked = ctx.llm(max_num_batched_tokens=7)
        for i, (a, b) in enumerate(zip(_embed(chunked, prompts, kind, False), batch)):
            _close(a, b, SAME_ATOL, f"prompt {i} (length {len(prompts[i])}): chunks of <= 7 tokens vs one step", ctx)
    else:
        ctx.note("chunked_prefill is not supported: the chunk part was not run")
