"""OutputProcessor: what a request's sampled tokens become for the caller.

It owns the text side of a request: the incremental detokenizer that stop strings are
matched in (attached when the request is added; the scheduler's stop rules ask it about
each new token), the final text, and the RequestOutput record.
"""
from __future__ import annotations

from typing import Any

from core_runner.engine.detokenizer import IncrementalDetokenizer
from core_runner.engine.outputs import RequestOutput
from core_runner.engine.request import Request


class OutputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def add_request(self, req: Request) -> None:
        """Attach what the request's stop strings need (nothing without stop strings)."""
        sp = req.sampling_params
        if sp is not None and sp.stop:
            req.detokenizer = IncrementalDetokenizer(self.tokenizer, sp.stop)

    def make_output(self, req: Request) -> RequestOutput:
        text = ""
        if req.detokenizer is not None:
            text = req.detokenizer.text  # cut before a stop string
        elif self.tokenizer is not None and req.output_token_ids:
            text = self.tokenizer.decode(req.output_token_ids, skip_special_tokens=True)
        cumulative = None
        if req.logprobs is not None:
            cumulative = sum(lp[t] for lp, t in zip(req.logprobs, req.output_token_ids))
        return RequestOutput(
            req_id=req.req_id, prompt_token_ids=req.prompt_token_ids, token_ids=list(req.output_token_ids),
            text=text, finish_reason=req.finish_reason or "", seed=req.seed,
            num_preemptions=req.num_preemptions, embedding=req.pooled,
            first_token_time=req.first_token_time, finish_time=req.finish_time, stop_reason=req.stop_reason,
            logprobs=req.logprobs, logprob_ranks=req.logprob_ranks, cumulative_logprob=cumulative,
            prompt_logprobs=req.prompt_logprobs,
        )
