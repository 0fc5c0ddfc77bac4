"""Equivalence checks of embedding registrations (task ``embed``): CR-EQ-10, CR-EQ-11.

The reference is the registration's reference class (an encoder or a decoder base
model): its final hidden states, pooled here by each pooling type, are what the engine's
``LLM.embed`` must return. Pooling types the model does not accept must be refused with a
ValueError naming them; at least one must be accepted.

Every embedding is compared with the reference, whatever else it is compared with: a
pooler that is wrong the same way chunked and unchunked (or in a fresh and a reused row)
is still wrong. Every request must finish normally with one vector of the model's
hidden size, in prompt order.
"""
from __future__ import annotations

from typing import Any

import torch

from core_runner.conformance.harness import Ctx, fail

EMBED_ATOL = 1e-4  # against the reference (float32)
SAME_ATOL = 1e-5  # the engine against itself under another schedule
LENGTHS = [1, 9, 3, 17, 6, 30]
CHUNK_BUDGETS = (5, 7)
# none a multiple of 5 or 7, and all but one longer than both budgets: chunk ends fall
# inside every prompt, at different offsets
CHUNK_LENGTHS = [8, 13, 3, 19, 11, 26]
# earlier, longer requests whose freed rows (and, chunked, carried pooling sums) the
# shorter requests after them take
LONG_LENGTHS = [40, 37, 33, 29]
SHORT_LENGTHS = [12, 2, 9, 16]
# the prefix cache would let a repeated last-token request skip its prompt (CR-EQ-09 checks
# that); here every request computes its whole prompt, in the chunks and rows planned
NO_CACHE = {"enable_prefix_caching": False}

Combo = tuple[str, bool]  # (pooling type, normalize)


def pool_hidden(hidden: torch.Tensor, kind: str) -> torch.Tensor:
    """The reference's [len, hidden] final states pooled as ``kind`` ("mean", "cls", "last")."""
    if kind == "mean":
        return hidden.mean(dim=0)
    if kind == "cls":
        return hidden[0]
    return hidden[-1]


# ---------------------------------------------------------------------------------
# running and comparing
# ---------------------------------------------------------------------------------
class _Pooled:
    """The reference's pooled vectors; each prompt's hidden states are computed once."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self._hidden: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, prompt: list[int], combo: Combo) -> torch.Tensor:
        key = tuple(prompt)
        if key not in self._hidden:
            self._hidden[key] = self.ctx.ref.hidden(list(prompt))
        hidden, (kind, normalize) = self._hidden[key], combo
        v = pool_hidden(hidden, kind)
        return torch.nn.functional.normalize(v, dim=-1) if normalize else v


def _params(combos: list[Combo] | Combo | None) -> Any:
    from core_runner import PoolingParams

    if isinstance(combos, list):  # one per prompt
        return [PoolingParams(pooling_type=k, normalize=n) for k, n in combos]
    return PoolingParams() if combos is None else PoolingParams(pooling_type=combos[0], normalize=combos[1])


def _vectors(ctx: Ctx, prompts: list[list[int]], outs: list[Any], where: str) -> list[torch.Tensor]:
    """Every request finished normally with one vector of the reference's hidden size, in
    prompt order; the vectors."""
    if len(outs) != len(prompts):
        fail(f"{where}: {len(outs)} outputs for {len(prompts)} prompts")
    hidden = int(ctx.ref.model.config.hidden_size)
    for i, (p, o) in enumerate(zip(prompts, outs)):
        what = f"{where}: prompt {i} (length {len(p)})"
        if not o.finished or o.finish_reason != "stop" or o.outputs is None:
            fail(f"{what} finished={o.finished} with finish_reason {o.finish_reason!r} and "
                 f"{'no vector' if o.outputs is None else 'a vector'} (expected 'stop' and one embedding)")
        if list(o.prompt_token_ids) != list(p):
            fail(f"{what}: its output is for another prompt ({len(o.prompt_token_ids)} tokens): outputs out of order")
        shape = tuple(o.outputs.data.shape)
        if shape != (hidden,):
            fail(f"{what}: embedding of shape {shape}, expected ({hidden},) (the hidden size)")
    return [o.outputs.data.float() for o in outs]


def _embed(ctx: Ctx, llm: Any, prompts: list[list[int]], combos: list[Combo] | Combo | None,
           where: str) -> list[torch.Tensor]:
    """One ``LLM.embed`` call (per-prompt params when ``combos`` is a list; None: the
    model's default pooling), its outputs checked by ``_vectors``."""
    return _vectors(ctx, prompts, llm.embed(prompts, _params(combos), use_tqdm=False), where)


def _close(got: torch.Tensor, want: torch.Tensor, atol: float, where: str, ctx: Ctx,
           prompt: list[int] | None = None) -> None:
    """``prompt`` given: ``want`` is the reference's, and a failure gets the diagnosis."""
    err = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
    prev = ctx.metrics["max_logit_error"]
    ctx.metrics["max_logit_error"] = err if prev is None else max(prev, err)
    if not err <= atol:
        against = "the reference" if prompt is not None else "the same prompt's"
        fail(f"{where}: embedding differs from {against} by {err:.3g} > {atol:g} (shape {tuple(got.shape)} vs "
             f"{tuple(want.shape)})" + (ctx.diagnosis(prompt) if prompt is not None else ""))


def _vs_reference(ctx: Ctx, pooled: _Pooled, prompts: list[list[int]], combos: list[Combo],
                  got: list[torch.Tensor], where: str, steps: list[list[int]] | None = None) -> None:
    """``steps``: each prompt's tokens per step, named in a failure."""
    for i, (p, c, g) in enumerate(zip(prompts, combos, got)):
        split = f", run in steps of {steps[i]} tokens" if steps and len(steps[i]) > 1 else ""
        _close(g, pooled(p, c), EMBED_ATOL, f"{where}: prompt {i} (length {len(p)}{split}) pooling {c[0]} "
               f"normalize={c[1]}", ctx, p)


def _vs_each_other(ctx: Ctx, prompts: list[list[int]], combos: list[Combo], got: list[torch.Tensor],
                   base: list[torch.Tensor], where: str) -> None:
    for i, (p, c, a, b) in enumerate(zip(prompts, combos, got, base)):
        _close(a, b, SAME_ATOL, f"{where}: prompt {i} (length {len(p)}) pooling {c[0]} normalize={c[1]}", ctx)


def _accepted_types(ctx: Ctx, llm: Any, prompt: list[int]) -> list[str]:
    from core_runner.pooling_params import POOLING_TYPES

    kinds = []
    for kind in POOLING_TYPES:
        try:
            _embed(ctx, llm, [prompt], (kind, False), f"probe of pooling {kind}")
        except ValueError as e:
            if kind not in str(e):
                fail(f"pooling_type={kind!r} was refused without naming it: {e}")
            ctx.note(f"pooling_type {kind!r} refused: {e}")
            continue
        kinds.append(kind)
    if not kinds:
        fail(f"every pooling type {POOLING_TYPES} was refused")
    return kinds


def _rotated(kinds: list[str], n: int, r: int) -> list[Combo]:
    """n prompts' (type, normalize) in rotation r: over rotations 0 .. len(kinds) - 1 every
    prompt gets every accepted type, beside prompts with other ones (the list repeats the
    types, raw then normalised, so any len(kinds) consecutive entries hold each type)."""
    combos = [(k, norm) for norm in (False, True) for k in kinds]
    return [combos[(i + r) % len(combos)] for i in range(n)]


class _Watch:
    """Per request, from the engine's step hook: the tokens of each step (its chunks), the
    row it ran in, and the largest step."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.chunks: dict[str, list[int]] = {}
        self.row: dict[str, int] = {}
        self.max_step = 0
        self._remove = engine.debug.on_step(self._saw)

    def _saw(self, out: Any) -> None:
        rows = self.engine.debug.rows()
        self.max_step = max(self.max_step, sum(out.num_scheduled_tokens.values()))
        for rid, n in out.num_scheduled_tokens.items():
            self.chunks.setdefault(rid, []).append(n)
            if rid in rows:
                self.row.setdefault(rid, rows[rid])

    def stop(self) -> None:
        self._remove()


def _embed_watched(ctx: Ctx, llm: Any, prompts: list[list[int]], combos: list[Combo],
                   where: str) -> tuple[list[torch.Tensor], list[str], _Watch]:
    """``_embed`` with the step hook on; also the request ids, in prompt order."""
    watch = _Watch(llm.engine)
    try:
        outs = llm.embed(prompts, _params(combos), use_tqdm=False)
    finally:
        watch.stop()
    return _vectors(ctx, prompts, outs, where), [o.request_id for o in outs], watch


# ---------------------------------------------------------------------------------
# CR-EQ-10
# ---------------------------------------------------------------------------------
def embeddings_match_reference(ctx: Ctx) -> None:
    llm = ctx.llm()
    pooled = _Pooled(ctx)
    prompts = ctx.ref.prompts(LENGTHS, seed=201)
    kinds = _accepted_types(ctx, llm, prompts[0])
    for kind in kinds:
        for normalize in (False, True):
            combos = [(kind, normalize)] * len(prompts)
            got = _embed(ctx, llm, prompts, (kind, normalize), f"pooling {kind}")
            _vs_reference(ctx, pooled, prompts, combos, got, "one type for the batch")
    mixed = _rotated(kinds, len(prompts), 0)
    got = _embed(ctx, llm, prompts, mixed, "mixed types")
    _vs_reference(ctx, pooled, prompts, mixed, got, "a batch mixing every pooling type, raw and normalised")
    _embed(ctx, llm, prompts, None, "the model's default pooling")  # runs too
    ctx.note(f"pooling types {kinds}, each raw and normalised, alone and mixed in one batch of {len(prompts)}")


# ---------------------------------------------------------------------------------
# CR-EQ-11
# ---------------------------------------------------------------------------------
def _batch_and_order(ctx: Ctx, llm: Any, pooled: _Pooled, kinds: list[str]) -> None:
    prompts = ctx.ref.prompts(LENGTHS, seed=211)
    combos = _rotated(kinds, len(prompts), 1)
    batch = _embed(ctx, llm, prompts, combos, "batch")
    _vs_reference(ctx, pooled, prompts, combos, batch, "in a batch")
    for i in (4, 0):  # alone, after the batch's rows were used and freed
        alone = _embed(ctx, llm, [prompts[i]], [combos[i]], "alone")
        _vs_reference(ctx, pooled, [prompts[i]], [combos[i]], alone, f"prompt {i} alone")
        _close(alone[0], batch[i], SAME_ATOL, f"prompt {i}: alone vs in a batch of {len(prompts)}", ctx)
    rev = _embed(ctx, llm, prompts[::-1], combos[::-1], "reversed")[::-1]
    _vs_reference(ctx, pooled, prompts, combos, rev, "reversed batch order (other rows)")
    _vs_each_other(ctx, prompts, combos, rev, batch, "reversed batch order vs in order")


def _reused_rows(ctx: Ctx, pooled: _Pooled, kinds: list[str], budget: int | None) -> str:
    """Longer requests (every type, chunked where the budget splits them) fill and free
    both rows; then shorter ones of every type take those rows. Returns a note."""
    llm = ctx.llm(max_num_seqs=2, max_num_batched_tokens=budget, **NO_CACHE)  # two rows: both are reused
    longs = ctx.ref.prompts(LONG_LENGTHS, seed=223)
    shorts = ctx.ref.prompts(SHORT_LENGTHS, seed=227)
    where = f"rows reused after longer requests{f', chunks of <= {budget} tokens' if budget else ''}"
    fresh = ctx.llm(**NO_CACHE)
    longest: dict[int, int] = {}  # row -> the longest request that ran in it so far
    reused = 0
    for r in range(len(kinds)):
        long_combos = _rotated(kinds, len(longs), r + 1)
        got, long_ids, w = _embed_watched(ctx, llm, longs, long_combos, where)
        _vs_reference(ctx, pooled, longs, long_combos, got, f"{where} (a longer request)",
                      [w.chunks.get(rid, []) for rid in long_ids])
        for rid, p in zip(long_ids, longs):
            if rid not in w.row:
                fail(f"setup ({where}): the step hook saw no row for the request of {len(p)} tokens")
            longest[w.row[rid]] = max(longest.get(w.row[rid], 0), len(p))
        combos = _rotated(kinds, len(shorts), r)
        got, ids, w = _embed_watched(ctx, llm, shorts, combos, where)
        for rid, p in zip(ids, shorts):
            if longest.get(w.row.get(rid), 0) <= len(p):
                fail(f"setup ({where}): the request of {len(p)} tokens ran in row {w.row.get(rid)}, which no "
                     f"longer request used before it (rows: longest request so far {longest})")
            reused += 1
        _vs_reference(ctx, pooled, shorts, combos, got, where, [w.chunks.get(rid, []) for rid in ids])
        _vs_each_other(ctx, shorts, combos, got, _embed(ctx, fresh, shorts, combos, "fresh engine"),
                       f"{where} vs one step in another engine")
    return f"{reused} requests in rows freed by longer ones" + (f" (chunks of <= {budget})" if budget else "")


def _chunked(ctx: Ctx, llm: Any, pooled: _Pooled, kinds: list[str]) -> str:
    prompts = ctx.ref.prompts(CHUNK_LENGTHS, seed=229)
    one_step: dict[int, list[torch.Tensor]] = {}
    boundaries = 0
    for budget in CHUNK_BUDGETS:
        chunked = ctx.llm(max_num_batched_tokens=budget, **NO_CACHE)
        for r in range(len(kinds)):
            combos = _rotated(kinds, len(prompts), r)
            where = f"chunks of <= {budget} tokens, rotation {r}"
            got, ids, watch = _embed_watched(ctx, chunked, prompts, combos, where)
            if watch.max_step > budget:
                fail(f"a step of {watch.max_step} tokens exceeded max_num_batched_tokens={budget}")
            for rid, p in zip(ids, prompts):
                pieces = watch.chunks.get(rid, [])
                if sum(pieces) != len(p) or (len(p) > budget and len(pieces) < 2):
                    fail(f"setup ({where}): the prompt of {len(p)} tokens ran in steps of {pieces}")
                boundaries += len(pieces) - 1
            _vs_reference(ctx, pooled, prompts, combos, got, where, [watch.chunks[rid] for rid in ids])
            if r not in one_step:
                one_step[r] = _embed(ctx, llm, prompts, combos, "one step")
            _vs_each_other(ctx, prompts, combos, got, one_step[r], f"{where} vs one step")
    return f"{boundaries} chunk boundaries inside prompts (budgets {list(CHUNK_BUDGETS)}, every type)"


def embedding_independent_of_batch_row_and_chunks(ctx: Ctx) -> None:
    llm = ctx.llm(**NO_CACHE)
    pooled = _Pooled(ctx)
    kinds = _accepted_types(ctx, llm, ctx.ref.prompts([5], seed=211)[0])
    _batch_and_order(ctx, llm, pooled, kinds)
    chunks = ctx.registration.capability("chunked_prefill").supported
    if chunks:
        ctx.note(_chunked(ctx, llm, pooled, kinds))
    else:
        ctx.note("chunked_prefill is not supported: the chunk part was not run")
    ctx.note(_reused_rows(ctx, pooled, kinds, CHUNK_BUDGETS[-1] if chunks else None))
