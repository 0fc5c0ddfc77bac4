"""Compile the sampler's, attention's and fused MoE's (bf16, fp8) Triton kernels for sm90 (H100/H200) without a GPU.

The launchers run on small CPU tensors with ``JITFunction.run`` replaced: every launch is
compiled for ``GPUTarget("cuda", 90, 32)`` from the arguments it was given (pointer and
integer types, the constexprs, num_warps) instead of being run. A kernel the GPU
compiler rejects (e.g. triton 3.6's layout pass crashing on a tensor-carrying while
loop) fails here, before any device time is spent. Run it with TRITON_INTERPRET unset
(the interpreter never compiles):

    python tests/kernels/sm90_compile.py            # every case, prints one line each
    python tests/kernels/sm90_compile.py --usage CASE ...   # + registers, stack, spills per kernel

``--usage`` reads each cubin's resource usage with triton's own cuobjdump: registers per
thread bound the programs an SM holds at once, and a kernel whose rare path needs a wide
sort pays that on every row.

To check another triton (the GPU image has 3.6): install it with
``pip install --no-deps --target DIR triton==3.6.0`` and put DIR first on PYTHONPATH.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

_PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int64: "*i64",
        torch.int32: "*i32", torch.int8: "*i8", torch.uint8: "*u8", torch.bool: "*i1",
        torch.float8_e4m3fn: "*fp8e4nv", torch.float8_e5m2: "*fp8e5"}


def _compile_launch(fn: JITFunction, args: tuple, kwargs: dict) -> str:
    """Compile one launch for sm90; returns the kernel's name."""
    names = fn.arg_names
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    options = {k: v for k, v in kwargs.items() if k in ("num_warps", "num_stages", "maxnreg", "launch_pdl")}
    sig, const, attrs = {}, {}, {}
    for i, (name, param) in enumerate(zip(names, fn.params)):
        value = bound.get(name, param.default)
        if param.is_constexpr:
            sig[name] = "constexpr"
            const[name] = value
        elif isinstance(value, torch.Tensor):
            sig[name] = _PTR[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0 and value != 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            sig[name] = "fp32"
        elif value is None:
            sig[name] = "constexpr"
            const[name] = None
        else:
            raise TypeError(f"{fn.__name__}: argument {name} of type {type(value).__name__} is not handled")
    ck = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options=options)
    return fn.__name__ + (f" [{_usage(ck.asm['cubin'])}]" if USAGE else "")


USAGE = False  # --usage: append each kernel's resource usage to its name


def _usage(cubin: bytes) -> str:
    """'REG:n STACK:n SHARED:n LOCAL:n' of a cubin (cuobjdump --dump-resource-usage)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:\d+ STACK:\d+ SHARED:\d+ LOCAL:\d+", out)
    return found.group(0) if found else out.strip()[-120:]


class compiling_for_sm90:
    """Context manager: launches inside compile for sm90 instead of running; the names of
    the compiled kernels collect in ``.compiled``."""

    def __enter__(self):
        self.compiled: list[str] = []
        self._run = JITFunction.run

        def run(fn, *args, grid, warmup, **kwargs):
            self.compiled.append(_compile_launch(fn, args, kwargs))

        JITFunction.run = run
        return self

    def __exit__(self, *exc):
        JITFunction.run = self._run
        return False


def sampler_cases(n: int = 8, vocab: int = 5008) -> dict:
    """name -> zero-argument callable that launches one sampler path on CPU tensors."""
    from core_runner.sample.gumbel_triton import gumbel_sample_triton
    from core_runner.sample.logprobs_triton import logsumexp_rank_triton
    from core_runner.sample.top_k_top_p_triton import cut_sample_triton, top_k_top_p_threshold_triton

    x = torch.randn(n, vocab)
    inv = torch.full((n,), 1.3)
    seeds = torch.arange(n)
    pos = torch.full((n,), 7)
    k = torch.full((n,), -1, dtype=torch.int32)
    p = torch.full((n,), 0.9)
    lmp = torch.full((n,), -float("inf"))
    xb = torch.randn(2, 151936)  # the benchmark's vocab: the split fallback's chunk count as on the GPU
    return {
        "gumbel": lambda: gumbel_sample_triton(x, inv, seeds, pos),
        "gumbel_threshold": lambda: gumbel_sample_triton(x, inv, seeds, pos, threshold=p),
        "cut": lambda: cut_sample_triton(x, inv, seeds, pos, k, p, lmp),  # the default shape
        "cut_block128_cap128": lambda: cut_sample_triton(x, inv, seeds, pos, k, p, lmp, block=128, cap=128),
        "cut_v151936": lambda: cut_sample_triton(xb, inv[:2], seeds[:2], pos[:2], k[:2], p[:2], lmp[:2]),
        # bf16 logits (an engine's default dtype on the GPU), read in place
        "cut_bf16": lambda: cut_sample_triton(x.bfloat16(), inv, seeds, pos, k, p, lmp),
        "threshold": lambda: top_k_top_p_threshold_triton(x, inv, k, p, lmp),
        "logprobs": lambda: logsumexp_rank_triton(x, pos),
    }


def attention_cases() -> dict:
    """MLA decode at the DeepSeek-V2-Lite shape (16 heads, L 512, R 64, block 16, bf16) and
    paged attention at Qwen3-0.6B's (16 q / 8 kv heads, D 128): decode, split decode and a
    prefill batch, launched with the GPU's pipeline depth (the CPU default is 1 stage)."""
    from core_runner.kernels.kv_write_triton import write_kv_triton
    from core_runner.kernels.mla_attention_triton import mla_attention_triton
    from core_runner.kernels.paged_attention_triton import paged_attention_triton

    reqs, heads, lora, rope, bs = 8, 16, 512, 64, 16
    q_c = torch.randn(reqs, heads, lora).bfloat16()
    q_pe = torch.randn(reqs, heads, rope).bfloat16()
    cache = torch.randn(1, 64, bs, 1, lora + rope).bfloat16()
    qsl = torch.arange(reqs + 1, dtype=torch.int32)
    lens = torch.full((reqs,), 100, dtype=torch.int32)
    bt = torch.arange(reqs * 8, dtype=torch.int32).view(reqs, 8)
    args = (q_c, q_pe, cache, qsl, lens, bt, 0.07)
    gpu = {"num_stages": 2}
    kv = torch.randn(2, 64, bs, 8, 128).bfloat16()
    q1 = torch.randn(reqs, 16, 128).bfloat16()
    qp = torch.randn(4 * 32, 16, 128).bfloat16()
    qslp = torch.arange(0, 4 * 32 + 1, 32, dtype=torch.int32)
    paged = (kv, qsl, lens, bt, 0.088)
    kv8 = kv.to(torch.float8_e4m3fn)
    kvs = torch.tensor([2.0, 0.5])
    return {
        "paged_decode": lambda: paged_attention_triton(q1, *paged, max_query_len=1, max_seq_len=128, num_splits=1,
                                                       config=gpu),
        "paged_split": lambda: paged_attention_triton(q1, *paged, max_query_len=1, max_seq_len=128, num_splits=4,
                                                      config=gpu),
        "paged_prefill": lambda: paged_attention_triton(qp, kv, qslp, lens[:4], bt[:4], 0.088, max_query_len=32,
                                                        max_seq_len=100, config=gpu),
        # sliding window + soft cap + sinks (Gemma 2 / gpt-oss layers), prefill and split decode
        "paged_options_prefill": lambda: paged_attention_triton(
            qp, kv, qslp, lens[:4], bt[:4], 0.088, max_query_len=32, max_seq_len=100, config=gpu,
            sliding_window=24, logits_soft_cap=50.0, sinks=torch.randn(16)),
        "paged_options_split": lambda: paged_attention_triton(
            q1, *paged, max_query_len=1, max_seq_len=128, num_splits=4, config=gpu, sliding_window=40,
            logits_soft_cap=30.0, sinks=torch.randn(16)),
        "mla": lambda: mla_attention_triton(*args, max_query_len=1, max_seq_len=128, num_splits=1, config=gpu),
        "mla_split": lambda: mla_attention_triton(*args, max_query_len=1, max_seq_len=128, num_splits=4,
                                                  config=gpu),
        # kv_cache_dtype="fp8": an e4m3 cache read by bf16 queries, and the saturating write
        "fp8kv_decode": lambda: paged_attention_triton(q1, kv8, *paged[1:], max_query_len=1, max_seq_len=128,
                                                       num_splits=1, config=gpu),
        "fp8kv_split": lambda: paged_attention_triton(q1, kv8, *paged[1:], max_query_len=1, max_seq_len=128,
                                                      num_splits=4, config=gpu),
        "fp8kv_prefill": lambda: paged_attention_triton(qp, kv8, qslp, lens[:4], bt[:4], 0.088, max_query_len=32,
                                                        max_seq_len=100, config=gpu),
        "fp8kv_write": lambda: write_kv_triton(kv8, q1[:, :8], q1[:, 8:], torch.arange(reqs)),
        "fp8kv_mla": lambda: mla_attention_triton(q_c, q_pe, cache.to(torch.float8_e4m3fn), *args[3:],
                                                  max_query_len=1, max_seq_len=128, num_splits=4, config=gpu),
        # with checkpoint k / v scales (a float32 [2] device buffer the kernels load)
        "fp8kv_scaled_split": lambda: paged_attention_triton(q1, kv8, *paged[1:], max_query_len=1, max_seq_len=128,
                                                             num_splits=4, config=gpu, kv_scale=kvs),
        "fp8kv_scaled_prefill": lambda: paged_attention_triton(qp, kv8, qslp, lens[:4], bt[:4], 0.088,
                                                               max_query_len=32, max_seq_len=100, config=gpu,
                                                               kv_scale=kvs),
        "fp8kv_scaled_write": lambda: write_kv_triton(kv8, q1[:, :8], q1[:, 8:], torch.arange(reqs), kvs),
        "fp8kv_scaled_mla": lambda: mla_attention_triton(q_c, q_pe, cache.to(torch.float8_e4m3fn), *args[3:],
                                                         max_query_len=1, max_seq_len=128, num_splits=4, config=gpu,
                                                         kv_scale=kvs),
    }


def moe_cases() -> dict:
    """The fused MoE grouped GEMM in bf16 with expert biases and gpt-oss's clamped SwiGLU
    (its own activation kernel), and without (silu_mul), with the GPU's pipeline depth."""
    from core_runner.kernels.fused_moe_triton import fused_moe_triton
    from core_runner.kernels.moe_align_triton import moe_align_triton

    t, e, k, h, i = 64, 32, 4, 256, 192
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(t, h, generator=g).bfloat16(), torch.rand(t, k, generator=g)
    w13, w2 = torch.randn(e, 2 * i, h, generator=g).bfloat16(), torch.randn(e, h, i, generator=g).bfloat16()
    b13, b2 = torch.randn(e, 2 * i, generator=g).bfloat16(), torch.randn(e, h, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    gpu = {"num_stages": 3}
    return {
        "moe": lambda: fused_moe_triton(x, w13, w2, w, ids, config=gpu),
        "moe_bias_swigluoai": lambda: fused_moe_triton(x, w13, w2, w, ids, config=gpu, w13_bias=b13, w2_bias=b2,
                                                       activation="swigluoai"),
        # silu(gate) * up in the first GEMM's epilogue (two accumulators): at the wide tile the default
        # takes from ~100 rows an expert and at that tile with half the columns
        "moe_silu_epilogue": lambda: (
            fused_moe_triton(x, w13, w2, w, ids, fuse_activation=True,
                             config={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}),
            fused_moe_triton(x, w13, w2, w, ids, fuse_activation=True,
                             config={"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3})),
        # the alignment CUDA takes (align_pairs): V2-Lite's 64 experts of top-6 at a decode step, V3's 256
        "moe_align": lambda: (moe_align_triton(torch.randint(0, 64, (1024, 6), generator=g), 64, 16),
                              moe_align_triton(torch.randint(0, 256, (64, 8), generator=g), 256, 128)),
    } | moe_fp8_cases()


def moe_fp8_cases() -> dict:
    """The fp8 grouped GEMM with [128, 128] blocks: the decode tile (M16 N64, fp8 dot of
    K 128) plain, and the prefill tile (M128 N128, 8 warps) with biases and swigluoai."""
    from core_runner.kernels.fused_moe_fp8_triton import fused_moe_fp8_triton

    t, e, k, h, i, block = 64, 32, 4, 256, 256, (128, 128)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(t, h, generator=g).bfloat16(), torch.rand(t, k, generator=g)
    w13 = torch.randn(e, 2 * i, h, generator=g).to(torch.float8_e4m3fn)
    w2 = torch.randn(e, h, i, generator=g).to(torch.float8_e4m3fn)
    s13, s2 = torch.rand(e, 2 * i // 128, h // 128), torch.rand(e, h // 128, i // 128)
    b13, b2 = torch.randn(e, 2 * i, generator=g).bfloat16(), torch.randn(e, h, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    wide = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}
    return {
        "moe_fp8": lambda: fused_moe_fp8_triton(x, w13, s13, w2, s2, block, w, ids, config={"num_stages": 3}),
        "moe_fp8_wide_bias_swigluoai": lambda: fused_moe_fp8_triton(x, w13, s13, w2, s2, block, w, ids, config=wide,
                                                                    w13_bias=b13, w2_bias=b2, activation="swigluoai"),
    }


def main(names: list[str]) -> int:
    global USAGE
    if "--usage" in names:
        USAGE = True
        names = [n for n in names if n != "--usage"]
    cases = sampler_cases() | attention_cases() | moe_cases()
    failed = 0
    for name in names or list(cases):
        t = time.perf_counter()
        try:
            with compiling_for_sm90() as c:
                cases[name]()
            print(f"ok   {name}: {', '.join(c.compiled)} ({time.perf_counter() - t:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 (report every case)
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[-300:]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
