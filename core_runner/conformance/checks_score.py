"""CR-EQ-17: ``LLM.score(text_1, text_2)`` against the transformers reference, for
cross-encoders (registrations serving ``score``: a classifier of one label) and for
embedding models (task ``embed``: the cosine of the two texts' embeddings).

Text needs a tokenizer: the suite's checkpoints carry one (``conformance/tokenizer.py``),
loaded by the engine and, here, by transformers from the same files. A cross-encoder's pair
goes through the tokenizer's pair template with its token types (``[CLS] a [SEP] b [SEP]``,
types 0 then 1 for an encoder with token-type embeddings); the reference is the
registration's classifier on those ids and types, its one logit through the sigmoid (raw
with ``use_activation=False``). An embedding model's reference is its final hidden states
pooled as the engine's default pooling type, and the cosine of the two vectors.

Pairings: one text_1 against N texts_2 and N against N, texts of mixed lengths in one call,
and, where chunked prefill is supported, step budgets of 5 and 7 tokens that put chunk ends
inside the pairs (activated scores only: the raw logits are compared in one-step runs). A
classifier of several labels must be refused by ``LLM.score`` naming
``num_labels`` (it has no single score).
"""
from __future__ import annotations

import inspect
import random
from typing import Any

import torch

from core_runner.conformance.checks_pooling import (
    CHUNK_BUDGETS,
    NO_CACHE,
    _Watch,
    pool_hidden,
)
from core_runner.conformance.harness import Ctx, fail

SCORE_ATOL = 1e-5  # activated scores and cosines (float32)
RAW_ATOL = 1e-4  # raw logits, as CR-EQ-15
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def texts(n: int, seed: int, words: tuple[int, int] = (1, 9)) -> list[str]:
    """``n`` texts of random words, of mixed lengths (deterministic for ``seed``)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(*words)
        out.append(" ".join("".join(rng.choice(_LETTERS) for _ in range(rng.randint(1, 6))) for _ in range(k)))
    return out


def _pairings() -> list[tuple[str, Any, list[str]]]:
    """(name, text_1, texts_2): 1 vs N, N vs N (mixed lengths), one pair."""
    many = texts(5, seed=401)
    return [("1 vs 5", texts(1, seed=403)[0], many), ("5 vs 5", texts(5, seed=409, words=(2, 12)), many),
            ("1 vs 1", "short", ["a longer second text of several words"])]


def tokenizer_or_skip(ctx: Ctx) -> Any:
    tok = ctx.ref.tokenizer()
    if tok is None:
        import pytest

        pytest.skip(f"not run: not applicable: the checkpoint has no tokenizer (vocab_size {ctx.ref.vocab} is "
                    "too small for the suite's byte vocabulary)")
    return tok


def scores_match_reference(ctx: Ctx) -> None:
    tok = tokenizer_or_skip(ctx)
    if "score" in ctx.registration.tasks:
        labels = int(getattr(ctx.ref.model.config, "num_labels", 1))
        if labels != 1:
            _expect_refused(ctx)
            return
        _run_all(ctx, lambda a, b: _cross_encoder_ref(ctx, tok, a, b), "cross-encoder")
    else:
        _run_all(ctx, _CosineRef(ctx), "cosine of embeddings")


def _expect_refused(ctx: Ctx) -> None:
    llm = ctx.llm(**NO_CACHE)
    labels = ctx.ref.model.config.num_labels
    try:
        llm.score("a", "b", use_tqdm=False)
    except ValueError as e:
        if "num_labels" not in str(e):
            fail(f"LLM.score on a classifier of {labels} labels was refused without naming num_labels: {e}")
        ctx.note(f"num_labels={labels}: LLM.score refuses it by name (a score needs one label)")
        return
    fail(f"LLM.score on a classifier of num_labels={labels} returned scores: it must refuse (one label per score)")


def _run_all(ctx: Ctx, reference: Any, kind: str) -> None:
    from core_runner import PoolingParams

    runs: list[tuple[str, dict]] = [("one step per call", {})]
    if ctx.chunked:
        runs += [(f"chunks of <= {b} tokens", {"max_num_batched_tokens": b}) for b in CHUNK_BUDGETS]
    cross = "score" in ctx.registration.tasks
    compared, boundaries = 0, 0
    for where, opts in runs:
        llm = ctx.llm(**NO_CACHE, **opts)
        for name, a, b in _pairings():
            for activate in ((True, False) if cross and not opts else (True,)):  # raw logits: once
                params = None if activate else PoolingParams(use_activation=False)
                watch = _Watch(llm.engine)
                try:
                    outs = llm.score(a, b, use_tqdm=False, pooling_params=params)
                finally:
                    watch.stop()
                pairs = list(zip([a] * len(b) if isinstance(a, str) else a, b))
                if len(outs) != len(pairs):
                    fail(f"{where}, {name}: {len(outs)} scores for {len(pairs)} pairs")
                for i, ((t1, t2), o) in enumerate(zip(pairs, outs)):
                    what = f"{where}, {name}: pair {i} ({t1!r}, {t2!r})"
                    if not o.finished or o.finish_reason != "stop" or o.outputs is None:
                        fail(f"{what} finished={o.finished} with finish_reason {o.finish_reason!r} (expected 'stop' "
                             "and a score)")
                    want, ids = reference(t1, t2) if activate else _cross_encoder_ref(ctx, ctx.ref.tokenizer(), t1,
                                                                                        t2, raw=True)
                    if cross and list(o.prompt_token_ids) != list(ids):
                        fail(f"{what}: the engine scored tokens {list(o.prompt_token_ids)}, the tokenizer's pair "
                             f"template gives {list(ids)}")
                    err = abs(float(o.outputs.score) - want)
                    prev = ctx.metrics["max_logit_error"]
                    ctx.metrics["max_logit_error"] = err if prev is None else max(prev, err)
                    atol = SCORE_ATOL if activate else RAW_ATOL
                    if not err <= atol:
                        fail(f"{what} ({kind}{'' if activate else ', raw logit'}): score {o.outputs.score:.7g}, the "
                             f"reference's {want:.7g} (differs by {err:.3g} > {atol:g})"
                             + (ctx.diagnosis(list(ids)) if cross else ""))
                    compared += 1
                budget = opts.get("max_num_batched_tokens")
                if budget:
                    boundaries += _count_splits(watch, budget, f"{where}, {name}")
    if ctx.chunked and boundaries == 0:
        fail("setup: no pair was split into chunks under the small step budgets")
    ctx.note(f"{kind}: {compared} scores compared (1 vs N, N vs N, one pair; mixed lengths)"
             + (f"; {boundaries} chunk boundaries inside pairs or texts" if ctx.chunked else
                "; chunked_prefill is not supported: the chunk part was not run"))


def _count_splits(watch: _Watch, budget: int, where: str) -> int:
    n = 0
    for rid, pieces in watch.chunks.items():
        if max(pieces) > budget:
            fail(f"setup ({where}): request {rid} ran {max(pieces)} tokens in one step over a budget of {budget}")
        n += len(pieces) - 1
    return n


def _cross_encoder_ref(ctx: Ctx, tok: Any, a: str, b: str, raw: bool = False) -> tuple[float, list[int]]:
    """The reference classifier's score of the pair (sigmoid of its one logit; raw: the logit)."""
    enc = tok(a, b, return_token_type_ids=True)
    ids = list(enc["input_ids"])
    model = ctx.ref.model
    x = torch.tensor([ids], dtype=torch.long)
    kw: dict[str, Any] = {"input_ids": x, "attention_mask": torch.ones_like(x)}
    if "token_type_ids" in inspect.signature(model.forward).parameters and enc.get("token_type_ids") is not None:
        kw["token_type_ids"] = torch.tensor([list(enc["token_type_ids"])], dtype=torch.long)
    with torch.no_grad():
        logit = model(**kw).logits[0].float().reshape(-1)[0]
    return float(logit if raw else torch.sigmoid(logit)), ids


class _CosineRef:
    """The cosine of the two texts' reference embeddings (the engine's default pooling type)."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.kind: str | None = None

    def _vector(self, text: str) -> torch.Tensor:
        ids = self.ctx.ref.tokenizer()(text)["input_ids"]
        return pool_hidden(self.ctx.ref.hidden(list(ids)), self._kind())

    def _kind(self) -> str:
        if self.kind is None:
            llm = self.ctx.llm(**NO_CACHE)
            self.kind = getattr(llm.engine.model_state, "default_pooling_type", None)
            if self.kind is None:
                fail("the embedding model has no default pooling type, so LLM.score cannot embed its texts")
        return self.kind

    def __call__(self, a: str, b: str) -> tuple[float, list[int]]:
        ids = self.ctx.ref.tokenizer()(a)["input_ids"] + self.ctx.ref.tokenizer()(b)["input_ids"]
        cos = torch.nn.functional.cosine_similarity(self._vector(a), self._vector(b), dim=0)
        return float(cos), ids
