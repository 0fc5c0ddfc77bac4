"""CR-BOUND-04 probes of the tensor-parallel options; registered with ``options.probe``.

They stay cheap: every value they try is refused before a worker starts. Running a
declared family with tensor_parallel_size > 1 is CR-TP-01's work (checks_parallel.py).
"""
from __future__ import annotations

from core_runner.conformance.checks_bounds import expect_raises
from core_runner.conformance.harness import Ctx, fail, greedy, run
from core_runner.conformance.options import _rejects, probe
from core_runner.oracle import UnsupportedError


def _declared(ctx: Ctx, cap: str) -> bool:
    return ctx.registration.capability(cap).supported


@probe("tensor_parallel_size")
def _tensor_parallel_size(ctx: Ctx) -> str:
    text = _rejects(ctx, "tensor_parallel_size=0", tensor_parallel_size=0)
    if _declared(ctx, "tensor_parallel"):
        return f"{text}; sizes > 1 run under CR-TP-01 (tensor_parallel declared supported)"
    expect_raises(lambda: ctx.engine(tensor_parallel_size=2), UnsupportedError,
                  "tensor_parallel_size=2 with tensor_parallel undeclared", match="tensor_parallel")
    return f"{text}; refuses tensor_parallel_size=2 by the capability's name (tensor_parallel not declared)"


@probe("enable_expert_parallel")
def _enable_expert_parallel(ctx: Ctx) -> str:
    text = _rejects(ctx, "enable_expert_parallel='yes'", enable_expert_parallel="yes")
    text += "; " + _rejects(ctx, "enable_expert_parallel=True with one rank", enable_expert_parallel=True)
    if _declared(ctx, "tensor_parallel") and not _declared(ctx, "expert_parallel"):
        expect_raises(lambda: ctx.engine(tensor_parallel_size=2, enable_expert_parallel=True), UnsupportedError,
                      "enable_expert_parallel=True with expert_parallel undeclared", match="expert_parallel")
        text += "; refuses it by the capability's name (expert_parallel not declared)"
    return text


@probe("nnodes")
def _nnodes(ctx: Ctx) -> str:
    return _rejects(ctx, "nnodes=2 with tensor_parallel_size=1 (not a divisor)", nnodes=2)


@probe("node_rank")
def _node_rank(ctx: Ctx) -> str:
    return _rejects(ctx, "node_rank=1 (an engine is node 0; other nodes run headless)", node_rank=1)


@probe("master_addr")
def _master_addr(ctx: Ctx) -> str:
    return _rejects(ctx, "master_addr=''", master_addr="")


@probe("master_port")
def _master_port(ctx: Ctx) -> str:
    text = _rejects(ctx, "master_port=0", master_port=0)
    expect_raises(lambda: ctx.engine(master_port=None, nnodes=2, tensor_parallel_size=2), ValueError,
                  "nnodes=2 without master_port", match="master_port")
    return text + "; rejects nnodes=2 without a master_port"


@probe("speculative_config")
def _speculative_config(ctx: Ctx) -> str:
    text = _rejects(ctx, "speculative_config={'method': 'medusa'}",
                    speculative_config={"method": "medusa", "num_speculative_tokens": 2})
    text += "; " + _rejects(ctx, "num_speculative_tokens=0",
                            speculative_config={"method": "ngram", "num_speculative_tokens": 0})
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}
    if not _declared(ctx, "speculative_decoding"):
        expect_raises(lambda: ctx.engine(speculative_config=spec), UnsupportedError,
                      "speculative_config with speculative_decoding undeclared", match="speculative_decoding")
        return text + "; refuses ngram by the capability's name (speculative_decoding not declared)"
    # repetitive: a lookup matches once the output repeats a token of the prompt or of itself
    # (a request is verified only after a match), which a random model's greedy text does soon
    prompt = (ctx.ref.prompts([4], seed=3)[0] * 4)[:16]
    want = run(ctx.engine(), [("a", prompt, greedy(24))])["a"].token_ids
    e = ctx.engine(speculative_config=spec)
    got = run(e, [("a", prompt, greedy(24))])["a"]
    if got.token_ids != want or not e.scheduler.spec_num_draft_tokens:
        fail(f"ngram speculation gave {got.token_ids} (without: {want}) with "
             f"{e.scheduler.spec_num_draft_tokens} tokens proposed")
    return text + f"; ngram proposes ({got.num_draft_tokens} proposed, {got.num_accepted_tokens} accepted) and " \
                  "keeps the greedy tokens"
