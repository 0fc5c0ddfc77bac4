"""OutputProcessor: what a request's sampled tokens become for the caller.

It owns the text side of a request: the incremental detokenizer that stop strings are
matched in (attached when the request is added; the scheduler's stop rules ask it about
each new token), the final text, the Logprob records and the RequestOutput (or, for an
embedding request, the EmbeddingRequestOutput).
"""
from __future__ import annotations

from typing import Any

from core_runner.engine.detokenizer import IncrementalDetokenizer
from core_runner.engine.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    Logprob,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
)
from core_runner.engine.request import Request


class OutputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._token_text: dict[int, str] = {}

    def add_request(self, req: Request) -> None:
        """Attach what the request's stop strings need (nothing without stop strings)."""
        sp = req.sampling_params
        if sp is not None and sp.stop:
            req.detokenizer = IncrementalDetokenizer(
                self.tokenizer, sp.stop, skip_special_tokens=sp.skip_special_tokens,
                include_stop_str=sp.include_stop_str_in_output,
            )

    def make_output(self, req: Request) -> RequestOutput | EmbeddingRequestOutput:
        if req.pooling_params is not None:
            task = getattr(req.pooling_params, "task", None)
            kind, made = {"classify": (ClassificationRequestOutput, ClassificationOutput),
                          "score": (ClassificationRequestOutput, ClassificationOutput),
                          "reward": (PoolingRequestOutput, PoolingOutput)}.get(
                              task, (EmbeddingRequestOutput, EmbeddingOutput))
            return kind(
                request_id=req.req_id, outputs=None if req.pooled is None else made(req.pooled),
                prompt_token_ids=req.prompt_token_ids, finished=req.is_finished, prompt=req.prompt,
                finish_reason=req.finish_reason, num_preemptions=req.num_preemptions,
                num_cached_tokens=req.num_cached_tokens,
            )
        sp = req.sampling_params
        text = ""
        if req.detokenizer is not None:
            text = req.detokenizer.text  # cut at a stop string
        elif self.tokenizer is not None and req.output_token_ids:
            skip = sp.skip_special_tokens if sp is not None else True
            text = self.tokenizer.decode(req.output_token_ids, skip_special_tokens=skip)
        logprobs, cumulative = None, None
        if req.logprobs is not None:
            cumulative = sum(lp[t] for lp, t in zip(req.logprobs, req.output_token_ids))
            logprobs = [self._records(d, t, rank) for d, t, rank in
                        zip(req.logprobs, req.output_token_ids, req.logprob_ranks)]
        prompt_logprobs = None
        if req.prompt_logprobs is not None:
            k = sp.prompt_logprobs if sp is not None else 0
            prompt_logprobs = [None] + [
                self._records(d, t, None if len(d) > k else 0)
                for d, t in zip(req.prompt_logprobs[1:], req.prompt_token_ids[1:])
            ]
        completion = CompletionOutput(
            index=0, text=text, token_ids=list(req.output_token_ids), cumulative_logprob=cumulative,
            logprobs=logprobs, finish_reason=req.finish_reason, stop_reason=req.stop_reason,
        )
        return RequestOutput(
            request_id=req.req_id, prompt=req.prompt, prompt_token_ids=req.prompt_token_ids,
            prompt_logprobs=prompt_logprobs, outputs=[completion], finished=req.is_finished,
            seed=req.seed, num_preemptions=req.num_preemptions, first_token_time=req.first_token_time,
            finish_time=req.finish_time, num_cached_tokens=req.num_cached_tokens,
            num_draft_tokens=req.num_draft_tokens, num_accepted_tokens=req.num_accepted_tokens,
        )

    def _records(self, entry: dict[int, float], chosen: int, chosen_rank: int | None) -> dict[int, Logprob]:
        """vLLM's ``{token id: Logprob}`` for one position. ``entry`` holds the chosen token
        and the top k; a top-k token's rank is 1 + the entries with a larger logprob (every
        such token is in the top k too). ``chosen_rank`` is the chosen token's rank when
        known, 0 when the chosen token is among the top k (so the same rule applies), None
        when it is neither (a prompt token outside the top k: its rank is not kept)."""
        values = sorted(entry.values(), reverse=True)
        out = {}
        for t, v in entry.items():
            if t == chosen and chosen_rank != 0:
                rank = chosen_rank
            else:
                rank = 1 + sum(1 for w in values if w > v)
            out[t] = Logprob(logprob=v, rank=rank, decoded_token=self._decode_one(t))
        return out

    def _decode_one(self, token: int) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._token_text.get(token)
        if text is None:
            text = self._token_text[token] = self.tokenizer.decode([token])
        return text
