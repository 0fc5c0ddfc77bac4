"""CR-BOUND-04: every EngineConfig option has an observable effect or rejects an invalid
value. One probe per field; a field without a probe fails the check, so a new option
cannot slip in silently. Each probe returns a one-line description for the report."""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from core_runner.conformance.checks_bounds import expect_raises, prefix_caching_refused
from core_runner.conformance.harness import CheckFailure, Ctx, Recorder, fail, greedy, run, sampled, supports_logprobs
from core_runner.conformance.state_tools import paged_caches
from core_runner.oracle import UnsupportedError

PROBES: dict[str, Callable[[Ctx], str]] = {}


def probe(name: str) -> Callable:
    def deco(fn: Callable[[Ctx], str]) -> Callable[[Ctx], str]:
        PROBES[name] = fn
        return fn
    return deco


def every_option_has_an_effect(ctx: Ctx) -> None:
    from core_runner.config import EngineConfig

    results: dict[str, str] = {}
    problems = []
    for f in dataclasses.fields(EngineConfig):
        fn = PROBES.get(f.name)
        if fn is None:
            problems.append(f"{f.name}: no probe; add one to core_runner/conformance/options.py showing its effect "
                            "or that an invalid value is rejected")
            continue
        try:
            results[f.name] = fn(ctx)
        except Exception as e:
            msg = str(e) if isinstance(e, CheckFailure) else f"the probe raised {type(e).__name__}: {e}"
            problems.append(f"{f.name}: {msg}")
            results[f.name] = f"FAILED: {msg}"
    ctx.metrics["options"] = results
    if problems:
        fail("; ".join(problems))


def _rejects(ctx: Ctx, what: str, **opts: Any) -> str:
    expect_raises(lambda: ctx.engine(**opts), ValueError, what, match=next(iter(opts)))
    return f"rejects {what}"


def _max_batch(e: Any, prompts: list[list[int]], n: int) -> tuple[int, int]:
    rec = Recorder(e)
    run(e, [(f"q{i}", p, greedy(n)) for i, p in enumerate(prompts)])
    return max(len(s.req_ids) for s in rec.steps), max(s.num_tokens for s in rec.steps)


@probe("model")
def _model(ctx: Ctx) -> str:
    from core_runner import LLM

    missing = str(Path(tempfile.gettempdir()) / "core-runner-conformance-no-such-checkpoint")
    expect_raises(lambda: LLM(missing, plugins=ctx.pm, dtype="float32"), (FileNotFoundError, ValueError),
                  "a missing checkpoint directory")
    return "rejects a missing checkpoint directory"


@probe("dtype")
def _dtype(ctx: Ctx) -> str:
    for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        e = ctx.engine(dtype=name)
        params = [(n, p) for n, p in e.model.named_parameters() if p.is_floating_point()]
        other = [n for n, p in params if p.dtype != dt]
        share = sum(p.numel() for _, p in params if p.dtype == dt) / max(1, sum(p.numel() for _, p in params))
        if share < 0.5:
            fail(f"dtype={name!r} left {1 - share:.0%} of the parameter elements in other dtypes ({other[:3]} ...): "
                 "build parameters in torch's default dtype (the loader sets it)")
        if other:
            ctx.note(f"dtype={name!r}: {len(other)} parameters kept another dtype on purpose? {other[:3]}")
        kv = [n for n, t in paged_caches(e).items() if t.dtype != dt]
        if kv:
            fail(f"dtype={name!r} gave KV caches {kv[:2]} another dtype")
        out = run(e, [("a", ctx.ref.prompts([5], seed=3)[0], greedy(2))])["a"]
        if len(out.token_ids) != 2:
            fail(f"dtype={name!r}: generation failed")
    return "float32 / bfloat16 set the parameter and KV-cache dtype; " + _rejects(ctx, "dtype='fp8'", dtype="fp8")


@probe("device")
def _device(ctx: Ctx) -> str:
    auto = ctx.engine(device="auto").config.device
    if auto != ("cuda" if torch.cuda.is_available() else "cpu"):
        fail(f"device='auto' resolved to {auto!r} (CUDA available: {torch.cuda.is_available()})")
    text = f"'auto' resolves to {auto!r}; " + _rejects(ctx, "device='tpu'", device="tpu")
    if torch.cuda.is_available():
        e = ctx.engine(device="cuda", block_size=16)
        if any(p.device.type != "cuda" for p in e.model.parameters()):
            fail("device='cuda' left parameters off the GPU")
        return text + "; 'cuda' places the model on the GPU"
    try:
        ctx.engine(device="cuda", block_size=16)
    except Exception as e:
        return text + f"; 'cuda' without a GPU fails ({type(e).__name__})"
    fail("device='cuda' was accepted on a machine without CUDA")
    return text


@probe("max_model_len")
def _max_model_len(ctx: Ctx) -> str:
    for mml in (16, 32):
        e = ctx.engine(max_model_len=mml)
        ok, over = ctx.ref.prompts([mml - 1, mml], seed=5)
        e.add_request(ok, greedy(1), req_id="ok")
        expect_raises(lambda e=e, over=over: e.add_request(over, greedy(1), req_id="over"), ValueError,
                      f"a prompt of max_model_len={mml} tokens", match="max_model_len")
        e.abort_request("ok")
    mp = ctx.ref.max_position
    if mp:
        expect_raises(lambda: ctx.engine(max_model_len=mp + 1), ValueError,
                      f"max_model_len above max_position_embeddings={mp}", match="max_position_embeddings")
    return "moves the longest accepted prompt (16 -> 15, 32 -> 31 tokens); rejects values above " \
           "max_position_embeddings and " + _rejects(ctx, "max_model_len=0", max_model_len=0)


@probe("max_num_seqs")
def _max_num_seqs(ctx: Ctx) -> str:
    prompts = ctx.ref.prompts([3, 4, 5, 6, 7], seed=7)
    two, _ = _max_batch(ctx.engine(max_num_seqs=2), prompts, 3)
    five, _ = _max_batch(ctx.engine(max_num_seqs=5), prompts, 3)
    if two > 2 or five != 5:
        fail(f"max_num_seqs=2 ran up to {two} requests per step, max_num_seqs=5 up to {five}")
    return "caps requests per step (2 -> 2, 5 -> 5); " + _rejects(ctx, "max_num_seqs=0", max_num_seqs=0)


@probe("max_num_batched_tokens")
def _max_num_batched_tokens(ctx: Ctx) -> str:
    mml = ctx.max_model_len(32)
    prompts = ctx.ref.prompts([20, 20, 20], seed=9)
    small = 6 if ctx.chunked else mml
    _, a = _max_batch(ctx.engine(max_model_len=mml, max_num_batched_tokens=small), prompts, 2)
    _, b = _max_batch(ctx.engine(max_model_len=mml, max_num_batched_tokens=4 * mml), prompts, 2)
    if a > small or b <= small:
        fail(f"budget {small}: steps of up to {a} tokens; budget {4 * mml}: up to {b}")
    return f"caps tokens per step ({small} -> {a}, {4 * mml} -> {b}); " + \
        _rejects(ctx, "max_num_batched_tokens=0", max_num_batched_tokens=0)


@probe("block_size")
def _block_size(ctx: Ctx) -> str:
    for bs in (2, 8):
        e = ctx.engine(block_size=bs)
        shapes = {tuple(t.shape[1:3]) for t in paged_caches(e).values()}
        if any(s[1] != bs for s in shapes):
            fail(f"block_size={bs} gave KV caches of (blocks, block_size) {shapes}")
        width = e.runner.req_state.tables()["block_table"].shape[1]
        if width != -(-e.config.max_model_len // bs):
            fail(f"block_size={bs}: the block table has {width} columns")
    return "sets the KV page size and block-table width; " + _rejects(ctx, "block_size=0", block_size=0)


@probe("num_kv_blocks")
def _num_kv_blocks(ctx: Ctx) -> str:
    if not ctx.paged:  # attention-free: nothing to size, so any pool asked for is refused
        if ctx.engine().num_blocks:
            fail(f"a model without paged layers got a KV pool of {ctx.engine().num_blocks} blocks")
        expect_raises(lambda: ctx.engine(num_kv_blocks=40), ValueError, "num_kv_blocks=40 without paged layers",
                      match="num_kv_blocks")
        return "no paged layer: no KV pool (0 blocks), num_kv_blocks=40 refused and " + \
            _rejects(ctx, "num_kv_blocks=0", num_kv_blocks=0)
    for n in (ctx.pool(40), ctx.pool(70)):
        e = ctx.engine(num_kv_blocks=n)
        if e.num_blocks != n or any(t.shape[1] != n for t in paged_caches(e).values()):
            fail(f"num_kv_blocks={n} allocated {e.num_blocks} blocks")
    expect_raises(lambda: ctx.engine(num_kv_blocks=1), ValueError, "num_kv_blocks=1 (less than one request)",
                  match="num_kv_blocks")
    return "sets the KV pool size; rejects a pool smaller than one request and " + \
        _rejects(ctx, "num_kv_blocks=0", num_kv_blocks=0)


def _blocks_for(ctx: Ctx, probe_value: Any, **opts: Any) -> int:
    # without row-state snapshots (prefix caching of row state), which would take memory too
    opts.setdefault("enable_prefix_caching", False if ctx.row_state else None)
    return ctx.engine(memory_probe=lambda device: probe_value, num_kv_blocks=None, max_num_seqs=64, block_size=4,
                      **opts).num_blocks


@probe("gpu_memory_utilization")
def _gpu_memory_utilization(ctx: Ctx) -> str:
    from core_runner.config import EngineConfig

    rep = ctx.engine().memory_report()
    if not ctx.paged:
        return _row_state_budget(ctx, rep, "gpu_memory_utilization") + "; " + \
            _rejects(ctx, "gpu_memory_utilization=1.5", gpu_memory_utilization=1.5)
    block_bytes = rep["kv_pool_bytes_per_token"] * 4
    # an idle device (free = total) where 0.05 of the total holds 500 blocks beyond 65 rows of state
    total = int((block_bytes * 500 + rep["state_bytes_per_row"] * 65) / 0.05)
    sizes = [_blocks_for(ctx, (total, total), gpu_memory_utilization=u) for u in (0.05, 0.1)]
    busy = _blocks_for(ctx, (total - total // 40, total), gpu_memory_utilization=0.1)  # 2.5% of it in use
    if not sizes[0] < busy < sizes[1]:
        fail(f"gpu_memory_utilization 0.05 / 0.1 of an idle device and 0.1 of a busy one gave {sizes[0]} / "
             f"{sizes[1]} / {busy} blocks: the pool must grow with it and shrink with memory in use")
    cfg = EngineConfig(model=str(ctx.ref.path), device="cuda", dtype="float32")
    if cfg.gpu_memory_utilization != 0.9:
        fail(f"a CUDA config defaults gpu_memory_utilization to {cfg.gpu_memory_utilization}, expected 0.9")
    return f"sizes the KV pool from total memory less memory in use ({sizes[0]} / {busy} / {sizes[1]} blocks); " \
        "0.9 by default on CUDA; " + _rejects(ctx, "gpu_memory_utilization=1.5", gpu_memory_utilization=1.5)


def _row_state_budget(ctx: Ctx, rep: dict, knob: str) -> str:
    """A model without paged layers has no pool to size: the memory option decides whether
    the per-row state (65 rows in ``_blocks_for``) fits. 0.05 of this memory leaves too
    little, 0.1 enough."""
    need = rep["state_bytes_per_row"] * 65
    mem = int(need / 0.075)
    probe_value = (mem, mem) if knob == "gpu_memory_utilization" else mem
    expect_raises(lambda: _blocks_for(ctx, probe_value, **{knob: 0.05}), ValueError,
                  f"{knob}=0.05 of memory short of the row state", match=knob)
    if _blocks_for(ctx, probe_value, **{knob: 0.1}):
        fail(f"{knob}=0.1: a model without paged layers got KV blocks")
    return "no paged layer: refuses a share of memory (0.05) short of 65 rows' state, runs with 0.1 (no KV pool)"


@probe("generation_config")
def _generation_config(ctx: Ctx) -> str:
    from core_runner import LLM

    with tempfile.TemporaryDirectory(prefix="cr-genconfig-") as tmp:
        path = Path(tmp)
        for f in ctx.ref.path.iterdir():
            (path / f.name).symlink_to(f.resolve())
        gen = path / "generation_config.json"
        values = json.loads(gen.read_text()) if gen.exists() else {}
        gen.unlink(missing_ok=True)
        gen.write_text(json.dumps({**values, "temperature": 0.25, "top_k": 7, "max_new_tokens": 3}))
        opts = dict(plugins=ctx.pm, dtype="float32", device="cpu", max_model_len=ctx.max_model_len(32),
                    max_num_seqs=2, num_kv_blocks=ctx.pool(64), block_size=4, strict=False)
        auto = LLM(str(path), generation_config="auto", **opts).get_default_sampling_params()
        plain = LLM(str(path), generation_config="vllm", **opts).get_default_sampling_params()
    if (auto.temperature, auto.top_k, auto.max_tokens) != (0.25, 7, 3):
        fail(f"generation_config='auto' did not take the checkpoint's temperature 0.25, top_k 7, max_new_tokens 3: "
             f"{auto}")
    if (plain.temperature, plain.top_k, plain.max_tokens) == (0.25, 7, 3):
        fail("generation_config='vllm' applied the checkpoint's sampling defaults")
    return "'auto' applies generation_config.json's sampling defaults, 'vllm' ignores them; " + \
        _rejects(ctx, "generation_config='hf'", generation_config="hf")


@probe("kv_cache_memory_fraction")
def _kv_fraction(ctx: Ctx) -> str:
    rep = ctx.engine().memory_report()
    if not ctx.paged:
        return _row_state_budget(ctx, rep, "kv_cache_memory_fraction") + "; " + \
            _rejects(ctx, "kv_cache_memory_fraction=1.5", kv_cache_memory_fraction=1.5)
    block_bytes = rep["kv_pool_bytes_per_token"] * 4
    # at fraction 0.05 the budget is 500 blocks beyond the row state of 65 rows; 0.1 gives more
    fake_free = int((block_bytes * 500 + rep["state_bytes_per_row"] * 65) / 0.05)
    sizes = [_blocks_for(ctx, fake_free, kv_cache_memory_fraction=f) for f in (0.05, 0.1)]
    if not sizes[0] < sizes[1]:
        fail(f"with num_kv_blocks=None, fractions 0.05 and 0.1 of the same free memory gave {sizes} blocks")
    expect_raises(lambda: _plan(ctx, kv_cache_memory_fraction=0.5), ValueError,
                  "kv_cache_memory_fraction on CUDA (gpu_memory_utilization sizes that pool)",
                  match="gpu_memory_utilization")
    return f"sizes the KV pool when num_kv_blocks=None on the CPU ({sizes[0]} -> {sizes[1]} blocks); refused on " \
        "CUDA (naming gpu_memory_utilization); " + \
        _rejects(ctx, "kv_cache_memory_fraction=1.5", kv_cache_memory_fraction=1.5)


@probe("seed")
def _seed(ctx: Ctx) -> str:
    prompts = ctx.ref.prompts([5, 9], seed=11)

    def tokens(seed: int) -> list:
        outs = run(ctx.engine(seed=seed), [(f"u{i}", p, sampled(8, seed=None, temperature=1.0))
                                           for i, p in enumerate(prompts)])
        return [outs[f"u{i}"].token_ids for i in range(len(prompts))]

    a = tokens(3)
    if tokens(3) != a or tokens(4) == a:
        fail("the engine seed does not decide the tokens of unseeded requests")
    return "decides unseeded requests' samples (same seed, same tokens; another seed, other tokens)"


def _plan(ctx: Ctx, **kw: Any) -> Any:
    from core_runner.config import EngineConfig
    from core_runner.oracle import plan_execution

    kw.setdefault("strict", False)
    cfg = EngineConfig(model=str(ctx.ref.path), device="cuda", dtype="float32", **kw)
    return plan_execution(cfg, ctx.registration)


@probe("strict")
def _strict(ctx: Ctx) -> str:
    plan = _plan(ctx, attention_backend="torch", strict=False)
    if not plan.downgrades:
        fail("setup: torch attention on CUDA should be a downgrade")
    expect_raises(lambda: _plan(ctx, attention_backend="torch", strict=True), UnsupportedError,
                  "strict=True with a downgraded plan", match="strict")
    return f"turns the downgrade {plan.downgrades[0]!r} into an UnsupportedError (CUDA plan)"


@probe("enforce_eager")
def _enforce_eager(ctx: Ctx) -> str:
    eager, graphs = _plan(ctx, enforce_eager=True), _plan(ctx, enforce_eager=False)
    if eager.cuda_graphs:
        fail("enforce_eager=True still plans CUDA graphs")
    if graphs.cuda_graphs:
        return "turns CUDA graphs off in the CUDA plan"
    return f"consistent: CUDA graphs are off either way here ({'; '.join(graphs.downgrades) or 'no graphs'})"


@probe("max_cudagraph_capture_size")
def _max_cudagraph_capture_size(ctx: Ctx) -> str:
    from core_runner.config import EngineConfig
    from core_runner.runner.cuda_graphs import CudaGraphManager, capture_sizes

    _rejects(ctx, "max_cudagraph_capture_size=0", max_cudagraph_capture_size=0)
    cfg = EngineConfig(model=str(ctx.ref.path), device="cpu", max_num_seqs=8, max_num_batched_tokens=4096,
                       max_cudagraph_capture_size=4096)
    graphs = CudaGraphManager(capture_sizes(cfg.max_cudagraph_capture_size), cfg.max_num_seqs,
                              cfg.max_num_batched_tokens)
    default = CudaGraphManager(capture_sizes(None), cfg.max_num_seqs, cfg.max_num_batched_tokens)
    if graphs.select(8, 4000, False) is None or default.select(8, 4000, False) is not None:
        fail("a 4,000-token step should fit a graph only with max_cudagraph_capture_size=4096")
    return "sets the largest step replayed from a CUDA graph (4,000 tokens: graph at 4096, eager at the default)"


def _tiny_tokenizer(vocab: int) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "hello", "world", "core", "runner", "plugin"]
    tok = Tokenizer(models.WordLevel({w: 3 + i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = Path(tempfile.mkdtemp(prefix="cr-tokenizer-"))
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>"}')
    return str(path)


@probe("tokenizer")
def _tokenizer(ctx: Ctx) -> str:
    e = ctx.engine()
    if e.tokenizer is None:
        expect_raises(lambda: e.add_request("hello world", greedy(1)), ValueError, "a text prompt without a tokenizer",
                      match="tokenizer")
    else:  # the suite's checkpoints carry one (conformance/tokenizer.py): text goes through it
        want = ctx.ref.tokenizer()("hello world")["input_ids"]
        got = run(e, [("c", "hello world", greedy(1))])["c"].prompt_token_ids
        if list(got) != list(want):
            fail(f"the checkpoint's tokenizer encodes 'hello world' as {want}, the engine as {list(got)}")
    e = ctx.engine(tokenizer=_tiny_tokenizer(ctx.ref.vocab))
    out = run(e, [("t", "hello core runner", greedy(2))])["t"]
    if out.prompt_token_ids != [4, 6, 7]:
        fail(f"tokenizer=<dir> encoded 'hello core runner' as {out.prompt_token_ids}, expected [4, 6, 7]")
    try:
        ctx.engine(tokenizer=str(Path(tempfile.gettempdir()) / "cr-no-such-tokenizer"))
        ctx.note("tokenizer=<missing directory> is accepted at construction (fails only on a text prompt)")
    except (ValueError, OSError):
        pass
    return "text prompts are encoded with the given tokenizer directory"


@probe("max_logprobs")
def _max_logprobs(ctx: Ctx) -> str:
    text = _rejects(ctx, "max_logprobs=-1", max_logprobs=-1)
    if not supports_logprobs():
        return text + " (SamplingParams has no logprobs yet: its effect is not probed)"
    e = ctx.engine(max_logprobs=2)
    p = ctx.ref.prompts([4], seed=13)[0]
    expect_raises(lambda: e.add_request(p, sampled(2, logprobs=3)), ValueError, "logprobs=3 > max_logprobs=2",
                  match="logprobs")
    e.add_request(p, sampled(2, logprobs=2), req_id="ok")
    return text + "; caps SamplingParams.logprobs (3 > 2 rejected, 2 accepted)"


@probe("async_scheduling")
def _async(ctx: Ctx) -> str:
    if not ctx.registration.capability("async_scheduling").supported:
        expect_raises(lambda: ctx.engine(async_scheduling=True), UnsupportedError, "async_scheduling=True",
                      match="async_scheduling")
        return "async_scheduling=True is refused (capability unsupported)"
    arrivals = []
    for flag in (False, True):
        e = ctx.engine(async_scheduling=flag)
        e.add_request(ctx.ref.prompts([5], seed=17)[0], greedy(1), req_id="a")
        for step in range(1, 5):
            if e.step():
                arrivals.append(step)
                break
    if arrivals != [1, 2]:
        fail(f"a one-token request's output arrived at steps {arrivals} (sync, async); expected [1, 2]")
    return "async_scheduling=True returns a step's output one step later (sync: step 1, async: step 2)"


@probe("enable_prefix_caching")
def _prefix_caching(ctx: Ctx) -> str:
    text = _rejects(ctx, "enable_prefix_caching='yes'", enable_prefix_caching="yes")
    cap = ctx.registration.capability("prefix_caching")
    if not cap.supported:
        return text + "; " + prefix_caching_refused(ctx, f"prefix_caching declared {cap.state}")
    prompt = ctx.ref.prompts([13], seed=19)[0]
    hits = {}
    for flag in (None, False):
        # a model with row state resumes only at a state snapshot: one every block here
        snaps = {"mamba_block_size": 4} if flag is None and ctx.row_state else {}
        e = ctx.engine(enable_prefix_caching=flag, block_size=4, **snaps)
        if e.plan.prefix_caching != (flag is None):
            fail(f"enable_prefix_caching={flag} planned prefix_caching={e.plan.prefix_caching} (the family declares "
                 "it supported: the default turns it on, False off)")
        for i in range(2):  # the second finds the first's blocks
            run(e, [(f"p{i}", prompt, greedy(1))])
        hits[flag] = e.scheduler.prefix_cache_hits
    if not hits[None] or hits[False]:
        fail(f"a repeated prompt of 13 tokens found {hits[None]} cached tokens by default and {hits[False]} with "
             "enable_prefix_caching=False; expected some, then none")
    return text + f"; on by default (a repeated prompt finds {hits[None]} cached tokens), False turns it off (none)"


@probe("attention_backend")
def _attention_backend(ctx: Ctx) -> str:
    text = _rejects(ctx, "attention_backend='flash' (not registered)", attention_backend="flash")
    e = ctx.engine(attention_backend="torch")
    if e.plan.attention_backend != "torch" or getattr(e.runner.backend, "name", None) != "torch":
        fail(f"attention_backend='torch' planned {e.plan.attention_backend} (runner backend {e.runner.backend!r})")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        expect_raises(lambda: ctx.engine(attention_backend="triton"), UnsupportedError,
                      "attention_backend='triton' on the CPU without TRITON_INTERPRET=1", match="triton")
        text += "; refuses 'triton' on the CPU without the interpreter"
    cuda = _plan(ctx, attention_backend="torch", kernels="triton")
    if cuda.attention_backend != "torch" or cuda.cuda_graphs:
        fail(f"attention_backend='torch' on CUDA planned {cuda} (torch attention cannot be captured)")
    return "'torch' picks the torch reference backend (and no CUDA graphs on CUDA); " + text


@probe("kernels")
def _kernels(ctx: Ctx) -> str:
    text = _rejects(ctx, "kernels='cuda'", kernels="cuda")
    e = ctx.engine(kernels="torch")
    if e.plan.kernels != "torch" or e.runner.triton:
        fail(f"kernels='torch' planned kernels={e.plan.kernels!r} (runner triton={e.runner.triton})")
    cuda = _plan(ctx, kernels="torch")
    if cuda.kernels != "torch" or cuda.cuda_graphs:
        fail(f"kernels='torch' on CUDA planned {cuda} (graphs need the Triton kernels)")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        expect_raises(lambda: ctx.engine(kernels="triton"), UnsupportedError,
                      "kernels='triton' on the CPU without TRITON_INTERPRET=1", match="kernels='triton'")
        text += "; refuses 'triton' on the CPU without the interpreter"
    return "'torch' plans the torch reference layers and sampler (no CUDA graphs on CUDA); " + text


# probes of where the checkpoint comes from and of the parallelism options
import core_runner.conformance.options_kv  # noqa: E402, F401
import core_runner.conformance.options_parallel  # noqa: E402, F401
import core_runner.conformance.options_sources  # noqa: E402, F401
import core_runner.conformance.options_state  # noqa: E402, F401
