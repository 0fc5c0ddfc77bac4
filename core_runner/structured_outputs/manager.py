"""Grammar compilation (xgrammar, off the engine thread, cached) and per-request matchers.

``StructuredOutputManager.request(params, eos_ids)`` submits the compile to a small thread
pool (cached by kind + spec + options: one tokenizer per manager) and returns a
``GrammarRequest``: the scheduler keeps the request waiting until ``ready()`` (vLLM's
WAITING_FOR_FSM); the matcher is advanced on the host, by output index, from whichever side
learns a token first (the runner, reading the previous step's copy-out before it samples the
next step, or the scheduler's ``sync``), so each token is accepted exactly once. Under
speculative decoding ``fill_verification`` advances the matcher through a step's proposals to
build one mask per verification position and rolls it back (docs/structured_outputs.md).
"""
from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from core_runner.structured_outputs.params import StructuredOutputsParams

logger = logging.getLogger(__name__)


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise ValueError("structured outputs need xgrammar: install xgrammar (pip install xgrammar) to use "
                         "SamplingParams.structured_outputs / response_format") from None
    return xgrammar


def _detached() -> None:
    return None


class GrammarRequest:
    """One request's grammar: the compile future, then a matcher fed output tokens by index."""

    def __init__(self, future: Future, stop_ids: tuple[int, ...]) -> None:
        self.future = future
        self.stop_ids = stop_ids
        self._matcher: Any = None
        self.num_fed = 0
        self.failed: str | None = None
        # speculative decoding: the latest proposals (output index of the first, tokens)
        self.proposals: tuple[int, list[int]] | None = None

    def __reduce__(self):  # tensor-parallel workers get None: rank 0 samples, its tokens are broadcast
        return (_detached, ())

    def ready(self) -> bool:
        return self.future.done()

    def error(self) -> str | None:
        exc = self.future.exception() if self.future.done() else None
        return None if exc is None else str(exc)

    @property
    def matcher(self) -> Any:
        if self._matcher is None:
            xgr = _xgrammar()
            self._matcher = xgr.GrammarMatcher(self.future.result(), override_stop_tokens=list(self.stop_ids) or None,
                                               terminate_without_stop_token=not self.stop_ids)
        return self._matcher

    @property
    def terminated(self) -> bool:
        return self._matcher is not None and self._matcher.is_terminated()

    def feed(self, index: int, token: int) -> None:
        """Accept output token ``index`` if it is the next one (earlier indices: already fed)."""
        if index != self.num_fed or self.failed or self.terminated:
            return
        if not self.matcher.accept_token(int(token)):
            self.failed = f"token {token} at output index {index} is not allowed by the grammar"
            logger.error("structured outputs: %s", self.failed)
        self.num_fed += 1

    def sync(self, output_ids: list[int]) -> None:
        """Make the matcher's state that of ``output_ids`` (fed past them: rolled back)."""
        if self.num_fed > len(output_ids) and not self.failed:
            self.matcher.rollback(self.num_fed - len(output_ids))
            self.num_fed = len(output_ids)
        for i in range(self.num_fed, len(output_ids)):
            self.feed(i, output_ids[i])

    def reset(self, output_ids: list[int]) -> None:
        """Preemption / resume: start over and replay the known output."""
        if self._matcher is not None:
            self._matcher.reset()
        self.num_fed, self.failed, self.proposals = 0, None, None
        self.sync(output_ids)

    def note_proposals(self, start: int, tokens: list[int]) -> None:
        """The proposer's tokens for output indices ``start``, ``start + 1``, ... (the next
        verification step reads them from the token table; the host learns them here)."""
        self.proposals = (start, list(tokens))

    @property
    def wants_mask(self) -> bool:
        """Whether the next token is constrained (not after a failure or the grammar's end)."""
        return not (self.failed or self.terminated)

    def fill(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed next tokens into ``bitmask[row]``; False if the row needs no mask."""
        if not self.wants_mask:
            return False
        self.matcher.fill_next_token_bitmask(bitmask, row)
        return True

    def fill_verification(self, bitmask: torch.Tensor, row: int, k: int) -> int:
        """Masks for a step verifying ``k`` proposals, in ``bitmask[row:]``: the mask of the
        first position, then, walking the proposals on the matcher, one more after each
        proposal it accepts; then the matcher is rolled back to where it was (the tokens
        the step keeps are fed as any others). Returns how many masks were written (0: the
        row needs none); the step may keep at most that many minus one proposals. The walk
        stops at a proposal the grammar refuses (the masked sample at its position cannot
        equal it, so it would be rejected anyway), at one that completes the grammar (the
        sample at its position may still take it, as without speculation; nothing may
        follow it) and where the proposals are not known (then none is kept)."""
        if not self.fill(bitmask, row):
            return 0
        known = self.proposals[1] if self.proposals is not None and self.proposals[0] == self.num_fed else []
        walked = 0
        for token in known[:k]:
            if not self.matcher.accept_token(int(token)):
                break
            walked += 1
            if self.matcher.is_terminated():
                break
            self.matcher.fill_next_token_bitmask(bitmask, row + walked)
        filled = walked + 1 - int(walked > 0 and self.matcher.is_terminated())
        if walked:
            self.matcher.rollback(walked)
        return filled


class StructuredOutputManager:
    """Compiles grammars for one tokenizer and vocabulary (the logits' width)."""

    def __init__(self, tokenizer: Any, vocab_size: int, max_workers: int = 2) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grammar-compile")
        self._cache: dict[tuple, Future] = {}
        self._lock = threading.Lock()
        self._compiler: Any = None

    def _get_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                xgr = _xgrammar()
                info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            return self._compiler

    def request(self, params: StructuredOutputsParams, stop_ids: tuple[int, ...]) -> GrammarRequest:
        if self.tokenizer is None:
            raise ValueError("SamplingParams.structured_outputs needs a tokenizer, and this checkpoint has none")
        _xgrammar()
        key = params.cache_key()
        with self._lock:
            fut = self._cache.get(key)
            if fut is None or (fut.done() and fut.exception() is not None):
                fut = self._cache[key] = self._pool.submit(self._compile, params)
        return GrammarRequest(fut, stop_ids)

    def _compile(self, params: StructuredOutputsParams) -> Any:
        c = self._get_compiler()
        kind, any_ws = params.kind, not params.disable_any_whitespace
        try:
            if kind == "json":
                schema = params.json if isinstance(params.json, str) else json.dumps(params.json)
                return c.compile_json_schema(schema, any_whitespace=any_ws)
            if kind == "json_object":
                return c.compile_json_schema('{"type": "object"}', any_whitespace=any_ws)
            if kind == "regex":
                return c.compile_regex(params.regex)
            if kind == "choice":
                alts = " | ".join(json.dumps(ch) for ch in params.choice)
                return c.compile_grammar(f"root ::= {alts}")
            return c.compile_grammar(params.grammar)
        except Exception as e:  # xgrammar's own message names the unsupported feature
            raise ValueError(f"StructuredOutputsParams.{kind} cannot be compiled by xgrammar: {e}") from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class BatchFill:
    """``GrammarRequest.fill`` for many requests at once (``bitmask[rows[j]]`` for
    ``grammars[j]``, each wanting a mask), spread over xgrammar's threads: filling one row of a
    150k vocabulary takes tens of microseconds, so a batch of hundreds filled one by one holds a
    decode step. The thread pool is made on first use."""

    def __init__(self) -> None:
        self._batch: Any = None

    def __call__(self, grammars: list[GrammarRequest], bitmask: torch.Tensor, rows: list[int]) -> None:
        if self._batch is None:
            self._batch = _xgrammar().BatchGrammarMatcher()
        self._batch.batch_fill_next_token_bitmask([g.matcher for g in grammars], bitmask, rows)
