"""CR-BOUND-01..03 and 05: limits, bad input, and capabilities that must be refused.
(CR-BOUND-04, one probe per engine option, is options.py.)"""
from __future__ import annotations

from typing import Any, Callable

from core_runner.conformance.harness import Ctx, Recorder, drain, fail, greedy, run, step_until
from core_runner.conformance.state_tools import snapshot, snapshot_diff
from core_runner.oracle import UnsupportedError


def expect_raises(fn: Callable[[], Any], exc: type | tuple, what: str, match: str | None = None) -> str:
    """Run fn; it must raise exc (and mention ``match``). Returns the message."""
    try:
        fn()
    except exc as e:
        msg = str(e)
        if match is not None and match.lower() not in msg.lower():
            fail(f"{what}: raised {type(e).__name__} but its message does not mention {match!r}: {msg}")
        return msg
    except Exception as e:
        fail(f"{what}: raised {type(e).__name__}: {e}, expected {getattr(exc, '__name__', exc)}")
    fail(f"{what}: accepted, expected {getattr(exc, '__name__', exc)}")
    return ""


# ---------------------------------------------------------------------------------
# CR-BOUND-01
# ---------------------------------------------------------------------------------
def scheduler_limits_around_max_model_len(ctx: Ctx) -> None:
    mml = ctx.max_model_len(32)
    lengths = [mml - 1, mml - 2, 20, 9]
    prompts = ctx.ref.prompts(lengths, seed=79)
    n_new = 8
    budgets = {"above": 3 * mml, "equal": mml, "below": 5}
    for name, budget in budgets.items():
        opts = dict(max_model_len=mml, max_num_seqs=4, max_num_batched_tokens=budget)
        if name == "below" and not ctx.chunked:
            expect_raises(lambda opts=opts: ctx.engine(**opts), UnsupportedError,
                          f"max_num_batched_tokens={budget} < max_model_len={mml} without chunked prefill",
                          match="chunked prefill")
            ctx.note("a budget below max_model_len is refused (chunked prefill unsupported)")
            continue
        e = ctx.engine(**opts)
        rec = Recorder(e)
        outs = run(e, [(f"b{i}", p, greedy(n_new)) for i, p in enumerate(prompts)])
        where = f"budget {budget} ({name} max_model_len={mml})"
        for i, p in enumerate(prompts):
            o = outs[f"b{i}"]
            n = min(n_new, mml - len(p))
            if o.finish_reason != "length":
                fail(f"{where}: b{i} finished with {o.finish_reason!r}, expected 'length'")
            ctx.expect_greedy(p, o.token_ids, f"{where}: b{i} (prompt of {len(p)})", n)
        biggest = max(s.num_tokens for s in rec.steps)
        if biggest > budget:
            fail(f"{where}: a step computed {biggest} tokens")
        if name == "above" and biggest <= mml:
            fail(f"{where}: no step used more than max_model_len tokens (biggest {biggest})")
        if name == "below" and not any(0 < s.num_computed[r] < lengths[int(r[1:])] for s in rec.steps
                                       for r in s.req_ids):
            fail(f"{where}: no prompt was chunked")


# ---------------------------------------------------------------------------------
# CR-BOUND-02
# ---------------------------------------------------------------------------------
def prompt_of_max_model_len_minus_one(ctx: Ctx) -> None:
    mml = ctx.max_model_len(32)
    p1, p2 = ctx.ref.prompts([mml - 1, mml - 2], seed=83)
    layouts = [(4, None), (1, None), (mml, None)] + ([(4, 8)] if ctx.chunked else [])
    for block_size, budget in layouts:
        blocks = -(-mml // block_size)
        where = f"block_size {block_size}, {blocks} KV blocks" + (f", budget {budget}" if budget else "")
        e = ctx.engine(max_model_len=mml, block_size=block_size, num_kv_blocks=ctx.pool(blocks), max_num_seqs=2,
                       max_num_batched_tokens=budget)
        rec = Recorder(e)
        outs = run(e, [("a", p1, greedy(5))])
        o = outs["a"]
        if o.finish_reason != "length" or len(o.token_ids) != 1:
            fail(f"{where}: a prompt of {mml - 1} tokens gave {len(o.token_ids)} tokens, finish "
                 f"{o.finish_reason!r}; expected 1 token, 'length'")
        ctx.expect_greedy(p1, o.token_ids, f"{where}: prompt of max_model_len - 1")
        ctx.expect_logits_match_reference(rec, outs)
        o = run(e, [("b", p2, greedy(5))])["b"]
        if len(o.token_ids) != 2 or o.finish_reason != "length":
            fail(f"{where}: a prompt of {mml - 2} tokens gave {len(o.token_ids)} tokens ({o.finish_reason!r})")
        ctx.expect_greedy(p2, o.token_ids, f"{where}: prompt of max_model_len - 2")
        if e.debug.num_free_blocks != e.num_blocks:
            fail(f"{where}: KV blocks were not returned")


# ---------------------------------------------------------------------------------
# CR-BOUND-03
# ---------------------------------------------------------------------------------
def bad_prompts_rejected_cleanly(ctx: Ctx) -> None:
    mml = ctx.max_model_len(32)
    vocab = ctx.ref.vocab
    good = ctx.ref.prompts([7, 12, 5], seed=89)
    long_ = ctx.ref.prompts([mml, mml + 5], seed=97)
    e = ctx.engine(max_model_len=mml)
    outs: dict = {}
    e.add_request(good[0], greedy(10), req_id="g0")
    e.add_request(good[1], greedy(10), req_id="g1")
    step_until(e, outs, lambda: len(e.scheduler.requests["g0"].output_token_ids) >= 3)
    before = snapshot(e)
    bad = {
        f"a prompt of max_model_len={mml} tokens": (long_[0], "max_model_len"),
        f"a prompt of {mml + 5} tokens": (long_[1], "max_model_len"),
        "an empty prompt": ([], "empty"),
        f"token id {vocab} (vocabulary {vocab})": ([5, vocab, 6], "vocabulary"),
        "token id -1": ([5, -1], "vocabulary"),
    }
    for i, (what, (prompt, word)) in enumerate(bad.items()):
        expect_raises(lambda p=prompt, i=i: e.add_request(p, greedy(4), req_id=f"bad{i}"), ValueError, what,
                      match=word)
    diff = snapshot_diff(before, snapshot(e))
    if diff:
        fail(f"rejected prompts changed engine state: {diff}")
    e.add_request(good[2], greedy(10), req_id="g2")
    drain(e, outs)
    if sorted(outs) != ["g0", "g1", "g2"]:
        fail(f"outputs {sorted(outs)}: rejected requests must never run")
    for i, p in enumerate(good):
        ctx.expect_greedy(p, outs[f"g{i}"].token_ids, f"g{i} beside rejected prompts", 10)
    llm = ctx.llm(max_model_len=mml)
    expect_raises(lambda: llm.generate([good[0], long_[0]], greedy(3), use_tqdm=False), ValueError,
                  "LLM.generate with one over-length prompt", match="prompt 1")
    if llm.engine.has_unfinished_requests():
        fail("LLM.generate left requests queued after rejecting a prompt")


# ---------------------------------------------------------------------------------
# CR-BOUND-05
# ---------------------------------------------------------------------------------
def _cuda_config(ctx: Ctx, **kw: Any) -> Any:
    from core_runner.config import EngineConfig

    return EngineConfig(model=str(ctx.ref.path), device="cuda", dtype="float32", max_model_len=ctx.max_model_len(64),
                        **kw)


def unsupported_capability_refused(ctx: Ctx) -> None:
    from core_runner.oracle import plan_execution

    cap, reg = ctx.capability, ctx.registration
    state = reg.capability(cap)
    what = f"{cap} declared {state.state}"
    if state.not_applicable:
        ctx.confirm_not_applicable()
    if cap == "chunked_prefill":
        mml = ctx.max_model_len(64)
        expect_raises(lambda: ctx.engine(max_model_len=mml, max_num_batched_tokens=mml // 2), UnsupportedError,
                      f"{what}: max_num_batched_tokens < max_model_len", match="chunked prefill")
    elif cap == "async_scheduling":
        expect_raises(lambda: ctx.engine(async_scheduling=True), UnsupportedError,
                      f"{what}: async_scheduling=True", match="async_scheduling")
        expect_raises(lambda: plan_execution(_cuda_config(ctx, strict=True), reg), UnsupportedError,
                      f"{what}: strict plan on CUDA")
    elif cap == "cuda_graphs":
        expect_raises(lambda: plan_execution(_cuda_config(ctx, strict=True), reg), UnsupportedError,
                      f"{what}: strict plan on CUDA")
        plan = plan_execution(_cuda_config(ctx, strict=False), reg)
        if plan.cuda_graphs or not any(d.startswith("CUDA graphs off") for d in plan.downgrades):
            fail(f"{what}: the non-strict CUDA plan {plan} does not name the CUDA graphs downgrade")
        if ctx.session.gpu:
            expect_raises(lambda: ctx.engine(device="cuda", block_size=16, strict=True), UnsupportedError,
                          f"{what}: strict engine on CUDA")
    elif cap == "triton_attention":
        expect_raises(lambda: plan_execution(_cuda_config(ctx, strict=True), reg), UnsupportedError,
                      f"{what}: strict plan on CUDA", match="Triton attention")
        plan = plan_execution(_cuda_config(ctx, strict=False), reg)
        if plan.attention_backend == "triton":
            fail(f"{what}: the CUDA plan still uses Triton attention")
        try:
            plan_execution(_cuda_config(ctx, strict=False, attention_backend="triton"), reg)
            ctx.note("attention_backend='triton' on CUDA is downgraded with a warning, not refused (core oracle)")
        except UnsupportedError:
            pass
    elif cap == "prefix_caching":
        ctx.note(prefix_caching_refused(ctx, what))
    elif cap == "tensor_parallel":
        expect_raises(lambda: ctx.engine(tensor_parallel_size=2), UnsupportedError,
                      f"{what}: tensor_parallel_size=2", match="tensor_parallel")
    elif cap == "speculative_decoding":
        expect_raises(lambda: ctx.engine(speculative_config={"method": "ngram", "num_speculative_tokens": 2}),
                      UnsupportedError, f"{what}: speculative_config", match="speculative_decoding capability")
    elif cap == "expert_parallel":
        expect_raises(lambda: ctx.engine(tensor_parallel_size=2, enable_expert_parallel=True), UnsupportedError,
                      f"{what}: enable_expert_parallel=True", match="_parallel capability")
    elif cap.startswith("quantization:"):
        _quantized_checkpoint_refused(ctx, cap.split(":", 1)[1], what)
    elif cap == "kv_cache_dtype:fp8":
        expect_raises(lambda: ctx.engine(kv_cache_dtype="fp8"), UnsupportedError, f"{what}: kv_cache_dtype='fp8'",
                      match="kv_cache_dtype")
    else:
        fail(f"the suite has no refusal probe for capability {cap!r}")


def prefix_caching_refused(ctx: Ctx, what: str) -> str:
    """enable_prefix_caching=True on a family that does not support it: UnsupportedError in
    strict mode, a named downgrade otherwise; the default (None) leaves the cache off
    without one. Also CR-BOUND-04's probe of the option."""
    expect_raises(lambda: ctx.engine(enable_prefix_caching=True, strict=True), UnsupportedError,
                  f"{what}: enable_prefix_caching=True, strict", match="prefix caching")
    plan = ctx.engine(enable_prefix_caching=True).plan
    if plan.prefix_caching or not any(d.startswith("prefix caching off") for d in plan.downgrades):
        fail(f"{what}: enable_prefix_caching=True (not strict) planned prefix_caching={plan.prefix_caching} with "
             f"downgrades {plan.downgrades}, expected it off with a named 'prefix caching off' downgrade")
    plan = ctx.engine().plan
    if plan.prefix_caching or any(d.startswith("prefix caching") for d in plan.downgrades):
        fail(f"{what}: the default enable_prefix_caching=None planned prefix_caching={plan.prefix_caching} with "
             f"downgrades {plan.downgrades}, expected it off and no prefix-caching downgrade (nothing was asked for)")
    return "enable_prefix_caching=True is refused in strict mode and a named downgrade otherwise; the default " \
        "leaves it off silently"


def _quantized_checkpoint_refused(ctx: Ctx, method: str, what: str) -> None:
    """The example checkpoint with a quantization_config added must be refused at
    construction (its tensors are the unquantized ones: loading them would be silent)."""
    import json
    import tempfile
    from pathlib import Path

    from core_runner import LLM
    from core_runner.conformance.quantized import compressed_tensors_fp8_config

    src = Path(ctx.ref.path)
    with tempfile.TemporaryDirectory() as tmp:
        for f in src.iterdir():
            if f.name != "config.json":
                (Path(tmp) / f.name).symlink_to(f.resolve())
        cfg = json.loads((src / "config.json").read_text())
        cfg["quantization_config"] = ({"quant_method": method, "fmt": "e4m3", "activation_scheme": "dynamic",
                                       "weight_block_size": [128, 128]} if method != "compressed-tensors"
                                      else compressed_tensors_fp8_config())
        (Path(tmp) / "config.json").write_text(json.dumps(cfg))
        expect_raises(lambda: LLM(tmp, plugins=ctx.pm, dtype="float32", device="cpu",
                                  max_model_len=ctx.max_model_len(64)), UnsupportedError,
                      f"{what}: a checkpoint with quant_method {method!r}", match=f"quantization:{method}")
